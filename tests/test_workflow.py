"""The research workflow as Python: record -> featurize -> cross_fit -> evaluate on tiny models, each stage's
object opened back from disk, the commands giving the same outputs, and no command run through the CLI."""

import ast
from pathlib import Path

import pandas as pd
import pytest
from decode_helpers import saved_tiny_inputs

from specrank.cli import main
from specrank.decode import DecodeConfig, ModelSpec
from specrank.workflow import Features, Recording, Rerankers, cross_fit, evaluate, featurize, record

TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is"]
POOL = dict(budget=8, extra=4)
GBM = {"n_estimators": 20, "num_leaves": 7}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("workflow")
    return d, *saved_tiny_inputs(d, TEXTS)


@pytest.fixture(scope="module")
def recording(inputs):
    d, tgt, drf, prompts = inputs
    return record(ModelSpec(str(tgt), f"standalone:{drf}"), prompts, out=d / "run",
                  config=DecodeConfig(temperature=1.0, max_new_tokens=8, **POOL), progress=False)


def test_each_stage_returns_an_object_that_opens_back_from_where_it_says(recording, tmp_path):
    assert Recording.open(recording.path).manifest == recording.manifest
    assert recording.manifest["temperature"] == 1.0 and "rounds" in recording.summary
    features = featurize(recording, edges_out=tmp_path / "edges.parquet")
    assert features.path == recording.path / "features.parquet" and features.edges_path.is_file()
    opened = Features.open(features.path, features.edges_path)
    pd.testing.assert_frame_equal(opened.table(), features.table())
    rerankers = cross_fit(features, rerankers=("isotonic", "per_depth", "rows"), out=tmp_path / "rerankers", gbm=GBM)
    assert set(rerankers.fits) == {"isotonic", "per_depth", "rows"}
    again = Rerankers.open(rerankers.path)
    assert set(again.names) == {"isotonic", "per_depth", "rows"} and set(again.models("rows")) == {0, 1}
    pd.testing.assert_frame_equal(again.predictions(), rerankers.predictions())
    evaluation = evaluate(recording, rerankers, out=tmp_path / "evaluation", bootstrap=20)
    assert evaluation.path == tmp_path / "evaluation" and (evaluation.path / "report.md").is_file()
    assert {"draft", "isotonic", "per_depth", "rows", "root"} <= set(evaluation.summary["score"])


def test_the_commands_are_the_functions_behind_a_command_line(recording, tmp_path):
    features = featurize(recording, out=tmp_path / "api" / "features.parquet")
    api = cross_fit(features, rerankers="isotonic,rows", seed=3, gbm=GBM)
    argv = ["train", str(features.path), "--rerankers", "isotonic,rows", "--seed", "3", "--n-estimators", "20",
            "--num-leaves", "7", "--out-dir", str(tmp_path / "cli")]
    assert main(argv) == 0
    pd.testing.assert_frame_equal(Rerankers.open(tmp_path / "cli").predictions(), api.predictions())


def test_a_bad_reranker_name_is_refused_before_any_output(recording, tmp_path):
    with pytest.raises(ValueError, match="unknown reranker 'rowz'"):
        cross_fit(Features(recording.path / "features.parquet"), rerankers=("rowz",), out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_no_module_runs_a_command_through_the_command_line():
    """The package composes functions: only ``specrank.cli`` itself parses argv and dispatches commands."""
    src = Path(__file__).parents[1] / "src" / "specrank"
    offenders = []
    for path in src.rglob("*.py"):
        if path.name == "cli.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "specrank.cli" for n in names):
                offenders.append(str(path.relative_to(src)))
    assert offenders == []
