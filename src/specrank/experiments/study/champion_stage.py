"""The champion stage: the champion chosen from a temperature's figures, refitted on all its rounds and saved with
its card; and its announced install into the cache as ``reranker:NAME``."""

from __future__ import annotations

import logging
from pathlib import Path

from specrank.experiments.study.study_settings import StudySettings
from specrank.featurize import read_features
from specrank.files import file_hash
from specrank.law import Law
from specrank.layout import RunLayout
from specrank.rerankers import load_reranker, save_reranker
from specrank.rerankers.defaults import cached_reranker_dir
from specrank.workflow.champion import choose_champion, fit_champion, model_card
from specrank.workflow.stages import Stages, timed

log = logging.getLogger(__name__)


def champion_stage(run_dir: Path, figures: dict, recorded, temp: float, settings: StudySettings,
                   threads: int | None, *, prompts_path, command: str) -> dict:
    """Choose the champion from ``figures``, refit it on every round of ``run_dir`` and save it with its card in
    ``run_dir/champion`` (redone only when the features or the choice changed); returns the choice and its path."""
    choice = choose_champion(figures)
    run = RunLayout(run_dir)
    features, path = run.features, run.champion

    def fit_and_save():
        model = fit_champion(choice["reranker"], run_dir, read_features(features), tune_trials=settings.tune_trials,
                             seed=settings.seed, n_jobs=threads, gbm={"n_estimators": settings.trees})
        model.card_ = model_card(choice["reranker"], choice, figures, recorded, data=Path(prompts_path).name,
                                 command=command, temperature=temp)
        model.save(path)
        log.info(f"champion {choice['reranker']} (mean gain over draft {choice['mean_gain_pct']:+.2f}% of draft's value) -> {path}")

    Stages(run.stages).run("champion", f"{file_hash(features)}:{choice['reranker']}", path / "reranker.json",
                                        fit_and_save, clear=path)
    return {**choice, "path": str(path.relative_to(run_dir.parent))}


def install_champion(path: Path, temp: float, name: str = "default") -> Path:
    """Copy a named pair's study champion into the cache, where ``reranker:NAME`` finds it before the shipped one
    (as a head ``make drafter`` trains into the cache wins over the shipped head)."""
    target = cached_reranker_dir(Law(temp).name, name)
    with timed(f"install: the champion as reranker:{name} ({Law(temp).name}), outside --out -> {target}"):
        target.parent.mkdir(parents=True, exist_ok=True)
        return save_reranker(load_reranker(path), target)
