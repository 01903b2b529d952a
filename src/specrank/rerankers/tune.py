"""Hyperparameter search with Optuna inside a training part only (inner prompt-level cross-fitting)."""

from __future__ import annotations

import hashlib

import numpy as np
from sklearn.base import clone

from specrank import schema
from specrank.featurize.features import features_meta
from specrank.folds import fold_splits
from specrank.rerankers.base import labels_of


def gbm_space(trial) -> dict:
    """The default search space of ``GBMReranker``: around the paper's settings, and down to small,
    strongly regularised models for the few hundred rounds a short recording gives."""
    return {
        "n_estimators": trial.suggest_int("n_estimators", 20, 800, log=True),
        "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.2, log=True),
        "num_leaves": trial.suggest_int("num_leaves", 3, 127, log=True),
        "min_child_samples": trial.suggest_int("min_child_samples", 5, 400, log=True),
        "reg_lambda": trial.suggest_float("reg_lambda", 1e-3, 30.0, log=True),
    }


def inner_folds(X) -> np.ndarray:
    """Alternate the training part's prompts (sorted by prompt number) between two inner folds."""
    schema.require_columns(X.columns, ["prompt_index"], "features")
    ranks = np.unique(X["prompt_index"].to_numpy(), return_inverse=True)[1].reshape(-1)
    return ranks % 2


def study_name(prefix: str, fold) -> str:
    """The study of one cross-fitting fold: ``<prefix>-fold<f>`` (``specrank train``: ``<run>-<reranker>-fold<f>``)."""
    return f"{prefix}-fold{fold}"


def study_seed(name: str, seed: int = 0) -> int:
    """A sampler seed derived from a study's name and the run seed: reproducible, and distinct per study."""
    return int.from_bytes(hashlib.sha256(f"{name}#{seed}".encode()).digest()[:4], "little")


def make_sampler(seed: int, n_trials: int):
    """TPE whose random start-up phase is a quarter of the budget (at least 3 trials), so that most of a short
    study is model-guided: Optuna's default start-up of 10 trials leaves 2 of the demo's 12 to TPE, a random
    search in all but name. ``benchmarks/bench_tuning.py`` compares samplers; on demo-sized data every one
    reaches the same best inner error after 12 trials within a standard error."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, n_trials // 4), multivariate=True)


def tune(estimator, X, y=None, *, n_trials: int = 20, space=gbm_space, seed: int = 0, timeout=None,
         callbacks=None, study_name: str | None = None, sampler=None) -> dict:
    """Best parameters of ``estimator`` by inner two-fold squared error on ``X`` (a training part).

    ``callbacks`` are Optuna callbacks ``(study, trial)`` called after each trial (e.g. a trial logger).
    The study is called ``study_name``; its sampler (default ``make_sampler``) is seeded from the name and
    ``seed``, so that two studies differ and the same study repeats.
    """
    import optuna

    y = labels_of(X, y, features_meta(X)["label_kind"])
    inner = inner_folds(X)
    if len(np.unique(inner)) < 2:
        raise ValueError("tune: the training part needs at least two prompts")

    def objective(trial):
        model = clone(estimator).set_params(**space(trial))
        err = 0.0
        for _, fit, held in fold_splits(inner):
            pred = clone(model).fit(X[fit], y[fit]).predict(X[held])
            err += float(np.sum((pred - y[held]) ** 2))
        return err / len(y)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if sampler is None:
        sampler = make_sampler(study_seed(study_name or "", seed), n_trials)
    study = optuna.create_study(study_name=study_name, direction="minimize", sampler=sampler)
    study.optimize(objective, n_trials=n_trials, timeout=timeout, callbacks=list(callbacks or ()))
    return dict(study.best_params)
