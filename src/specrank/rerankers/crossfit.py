"""Cross-fitting (App. D.8): fit on one half of the prompts, predict the other, and swap."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.base import clone

from specrank.folds import FoldError, fold_labels, fold_splits
from specrank.rerankers.tune import study_name, tune


@dataclass
class CrossFit:
    """Out-of-fold predictions (one per row) and the model that produced each fold's predictions."""

    predictions: np.ndarray
    folds: np.ndarray
    models: dict = field(default_factory=dict)  # fold value -> model fitted on every other fold
    params: dict = field(default_factory=dict)  # fold value -> tuned parameters (when tuned)
    spans: dict = field(default_factory=dict)  # fold value -> (start, end) epoch seconds of its tuning and fit


def cross_fit_table(estimator, X: pd.DataFrame, y=None, *, folds=None, fit_rows=None, tune_trials: int = 0,
              tune_seed: int = 0, tune_callbacks=None, tune_study: str | None = None) -> CrossFit:
    """Fit a clone of ``estimator`` on all folds but one and predict that fold, for every fold.

    No row is ever predicted by a model whose training rows share its prompt. ``estimator`` may map each fold to
    its own estimator (refitting fold models with their own hyper-parameters). ``fit_rows`` narrows what a
    fold's model is fitted on: a boolean mask (rows with a label), or ``fit_rows(fold, training rows)`` -> mask;
    every row of the fold is still predicted. With ``tune_trials > 0`` hyperparameters are first searched by
    ``tune`` inside each training part; ``tune_callbacks(fold)`` then gives the Optuna callbacks of the search for
    that fold's model, whose study is named ``<tune_study>-fold<f>`` (default prefix: the estimator's class name).
    """
    fold = fold_labels(X, folds)
    y = None if y is None else np.asarray(y, dtype=np.float64)
    out = CrossFit(predictions=np.full(len(X), np.nan), folds=fold)
    for f, train, test in fold_splits(fold):
        start = time.time()
        if fit_rows is not None:
            train = train & (fit_rows(f, train) if callable(fit_rows) else np.asarray(fit_rows, dtype=bool))
        if not train.any():
            raise FoldError(f"folds: the model that predicts fold {f} has no rows to fit on")
        base = estimator[f] if isinstance(estimator, Mapping) else estimator
        model = clone(base)
        y_train = None if y is None else y[train]
        if tune_trials:
            callbacks = tune_callbacks(f) if tune_callbacks is not None else None
            name = study_name(tune_study or type(base).__name__, f)
            out.params[f] = tune(model, X[train], y_train, n_trials=tune_trials, seed=tune_seed, callbacks=callbacks,
                                 study_name=name)
            model.set_params(**out.params[f])
        out.models[f] = model.fit(X[train], y_train)
        out.predictions[test] = model.predict(X[test])
        out.spans[f] = (start, time.time())
    return out
