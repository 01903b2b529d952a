"""Every experiment has one shape: ``experiment(models, settings, *, ...) -> Result`` with a frozen settings
dataclass in and a typed result out, and every experiment records through the workflow's one record stage."""

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "src" / "specrank" / "experiments"
# decode's own recorders: an experiment that called them would record beside the workflow's record stage
RECORDERS = {"record_run", "lossy_decode_run", "decode_on_workers"}


def entries():
    from specrank.experiments.online import compare_online
    from specrank.experiments.study import study
    from specrank.experiments.tree_config import tree_config
    from specrank.experiments.verify_sweep import verify_sweep

    return {"study": study, "online": compare_online, "tree_config": tree_config, "verify_sweep": verify_sweep}


@pytest.mark.parametrize("name", ["study", "online", "tree_config", "verify_sweep"])
def test_each_experiment_takes_models_and_frozen_settings_and_returns_a_typed_result(name):
    entry = entries()[name]
    hints = typing.get_type_hints(entry)
    params = list(inspect.signature(entry).parameters.values())
    assert [p.name for p in params[:2]] == ["models", "settings"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:]), name
    settings = hints["settings"]
    assert dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen, settings
    assert "prompts" in {f.name for f in dataclasses.fields(settings)} or "prompts_path" in {
        f.name for f in dataclasses.fields(settings)}  # what it decodes is part of its settings
    result = hints["return"]
    assert dataclasses.is_dataclass(result), result
    assert hasattr(result, "write") or hasattr(result, "open"), result  # it writes itself, or is its own folder


def test_no_experiment_records_beside_the_record_stage():
    calls = []
    for path in sorted(EXPERIMENTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                calls += [f"{path.name}: {a.name}" for a in node.names if a.name in RECORDERS]
    assert calls == []


def test_the_check_finds_a_recorder_imported_by_an_experiment(tmp_path, monkeypatch):
    (tmp_path / "rogue.py").write_text("from specrank.decode.runs import record_run\n")
    monkeypatch.setattr(__import__(__name__), "EXPERIMENTS", tmp_path)
    with pytest.raises(AssertionError):
        test_no_experiment_records_beside_the_record_stage()
