"""Hyperparameter search with Optuna inside a training part only (inner prompt-level cross-fitting)."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone

from specrank import schema
from specrank.rerankers.online import labels_of


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


def tune(estimator, X, y=None, *, n_trials: int = 20, space=gbm_space, seed: int = 0, timeout=None,
         callbacks=None) -> dict:
    """Best parameters of ``estimator`` by inner two-fold squared error on ``X`` (a training part).

    ``callbacks`` are Optuna callbacks ``(study, trial)`` called after each trial (e.g. a trial logger).
    """
    import optuna

    from specrank.featurize.features import features_meta

    y = labels_of(X, y, features_meta(X)["label_kind"])
    inner = inner_folds(X)
    if len(np.unique(inner)) < 2:
        raise ValueError("tune: the training part needs at least two prompts")

    def objective(trial):
        model = clone(estimator).set_params(**space(trial))
        err = 0.0
        for f in (0, 1):
            fit, held = inner != f, inner == f
            pred = clone(model).fit(X[fit], y[fit]).predict(X[held])
            err += float(np.sum((pred - y[held]) ** 2))
        return err / len(y)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=n_trials, timeout=timeout, callbacks=list(callbacks or ()))
    return dict(study.best_params)
