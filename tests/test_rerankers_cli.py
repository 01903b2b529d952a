"""`specrank featurize` and `specrank train` end to end on a small synthetic run directory."""

import numpy as np
import pandas as pd

from specrank.cli import main
from specrank.featurize import read_features
from specrank.featurize.synthetic import write_synthetic_run
from specrank.rerankers import load_reranker


def test_featurize_then_train(tmp_path, capsys):
    run = tmp_path / "run"
    write_synthetic_run(run, n_prompts=6, rounds_per_prompt=5, topk=4, depth=3, seed=7)
    assert main(["featurize", str(run), "--edges-out", str(tmp_path / "edges.parquet")]) == 0
    assert (run / "features.parquet").is_file()
    code = main(["train", str(run / "features.parquet"), "--rerankers", "isotonic,base,rows,per_depth",
                 "--edges", str(tmp_path / "edges.parquet"), "--n-estimators", "20", "--num-leaves", "7",
                 "--n-jobs", "1", "--out-dir", str(tmp_path / "out")])
    assert code == 0
    preds = pd.read_parquet(tmp_path / "out" / "predictions.parquet")
    assert len(preds) == 6 * 5 * 4
    assert {"prompt_id", "task", "round", "cand", "fold", "draft", "isotonic", "base", "rows", "per_depth"} <= set(preds)
    values = preds[["isotonic", "base", "rows", "per_depth"]].to_numpy()
    assert np.all((values >= 0) & (values <= 1))
    models = sorted(p.name for p in (tmp_path / "out" / "models").iterdir())
    assert models == sorted(f"{n}-fold{f}" for n in ("isotonic", "base", "rows", "per_depth") for f in (0, 1))
    # rows-fold0 (trained on fold 1) made the fold-0 predictions
    model = load_reranker(tmp_path / "out" / "models" / "rows-fold0")
    feats = read_features(run / "features.parquet")
    held = (feats.fold == 0).to_numpy()
    np.testing.assert_allclose(model.predict(feats[held]), preds.rows[held])


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["featurize", str(tmp_path / "nowhere")]) == 2
    assert "no run directory" in capsys.readouterr().err
    run = tmp_path / "run"
    write_synthetic_run(run, n_prompts=4, rounds_per_prompt=2, topk=3, depth=2, seed=1)
    main(["featurize", str(run)])
    assert main(["train", str(run / "features.parquet"), "--rerankers", "magic"]) == 2
    assert "unknown reranker 'magic'" in capsys.readouterr().err
    assert main(["train", str(run / "features.parquet"), "--rerankers", "per_depth"]) == 2
    assert "needs --edges" in capsys.readouterr().err
