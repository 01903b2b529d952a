"""benchmarks/bench_gbm_size.py on a small synthetic recorded run: every size is cross-fitted, evaluated on the same
rounds and paired with the reference."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from specrank.featurize.synthetic import synthetic_rounds

ROOT = Path(__file__).resolve().parent.parent


def test_the_size_benchmark_pairs_each_ensemble_with_the_reference_on_the_same_rounds(tmp_path):
    table, manifest = synthetic_rounds(n_prompts=12, rounds_per_prompt=15, topk=4, depth=3, seed=1)
    run = tmp_path / "run"
    (run / "rounds").mkdir(parents=True)
    pq.write_table(table, run / "rounds" / "shard-00000.parquet")
    (run / "manifest.json").write_text(json.dumps(manifest))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gbm_size.py"), "--run", str(run),
                          "--sizes", "20x7@0.2,5x3@0.3", "--online", "5x3", "--budgets", "4,8", "--bootstrap", "50"],
                         capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout)
    assert out.returncode == int(not result["met"]), out.stderr
    assert result["rounds"] == 180 and result["reference"] == "20x7" and result["online"] == "5x3"
    for name in ("rows", "base"):
        big, small = result["features"][name]["sizes"]["20x7"], result["features"][name]["sizes"]["5x3"]
        assert (small["n_estimators"], small["num_leaves"], small["learning_rate"]) == (5, 3, 0.3)
        assert big["gain_vs_reference_pct"] == {"4": [0.0, 0.0, 0.0], "8": [0.0, 0.0, 0.0]}
        low, high = small["gain_vs_reference_pct"]["8"][1:]
        assert low < high and small["gain_vs_reference_pct"]["8"] != [0.0, 0.0, 0.0]
        assert small["nodes"] < big["nodes"] and small["kernel_ms_back_to_back"] > 0
        share, share_low, share_high = small["root_share"]["4"]
        assert share_low <= share <= share_high


def test_a_size_that_is_not_trees_by_leaves_at_a_rate_is_refused_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gbm_size.py"), "--run", str(tmp_path),
                          "--sizes", "400x63"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stderr.strip().splitlines()[-1].startswith("--sizes: '400x63' is not")
