"""Cross-fitting (App. D.8): fit on one half of the prompts, predict the other, and swap."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.base import clone

from specrank import schema
from specrank.rerankers.tune import study_name, tune


class FoldError(ValueError):
    """A fold assignment that would let a model score a prompt it saw."""


def even_odd(prompt_index: np.ndarray) -> np.ndarray:
    """The paper's fold rule: fold = prompt number % 2 (even prompts vs odd prompts)."""
    return np.asarray(prompt_index) % 2


def fold_labels(X: pd.DataFrame, folds=None) -> np.ndarray:
    """Fold of every row: ``X["fold"]`` (None), a column name, a rule on ``prompt_index``, or an array.

    Raises FoldError when a prompt spans two folds or fewer than two folds are present.
    """
    if folds is None:
        folds = schema.FOLD_COLUMN
    if isinstance(folds, str):
        schema.require_columns(X.columns, [folds], "features")
        fold = X[folds].to_numpy()
    elif callable(folds):
        schema.require_columns(X.columns, ["prompt_index"], "features")
        fold = np.asarray(folds(X["prompt_index"].to_numpy()))
    else:
        fold = np.asarray(folds)
    if len(fold) != len(X):
        raise FoldError(f"folds: {len(fold)} labels for {len(X)} rows")
    per_prompt = pd.Series(fold).groupby(np.asarray(X["prompt_id"]), observed=True).nunique()
    if (per_prompt > 1).any():
        raise FoldError(f"folds: prompt {per_prompt.index[per_prompt.argmax()]} spans several folds")
    if len(np.unique(fold)) < 2:
        raise FoldError("folds: cross-fitting needs at least two folds")
    return fold


@dataclass
class CrossFit:
    """Out-of-fold predictions (one per row) and the model that produced each fold's predictions."""

    predictions: np.ndarray
    folds: np.ndarray
    models: dict = field(default_factory=dict)  # fold value -> model fitted on every other fold
    params: dict = field(default_factory=dict)  # fold value -> tuned parameters (when tuned)
    spans: dict = field(default_factory=dict)  # fold value -> (start, end) epoch seconds of its tuning and fit


def cross_fit(estimator, X: pd.DataFrame, y=None, *, folds=None, tune_trials: int = 0, tune_seed: int = 0,
              tune_callbacks=None, tune_study: str | None = None) -> CrossFit:
    """Fit a clone of ``estimator`` on all folds but one and predict that fold, for every fold.

    No row is ever predicted by a model whose training rows share its prompt. With
    ``tune_trials > 0`` hyperparameters are first searched by ``tune`` inside each training part;
    ``tune_callbacks(fold)`` then gives the Optuna callbacks of the search for that fold's model, whose
    study is named ``<tune_study>-fold<f>`` (default prefix: the estimator's class name).
    """
    fold = fold_labels(X, folds)
    y = None if y is None else np.asarray(y, dtype=np.float64)
    out = CrossFit(predictions=np.full(len(X), np.nan), folds=fold)
    for f in np.unique(fold):  # two folds in the paper
        start = time.time()
        train, test = fold != f, fold == f
        model = clone(estimator)
        y_train = None if y is None else y[train]
        if tune_trials:
            callbacks = tune_callbacks(f) if tune_callbacks is not None else None
            name = study_name(tune_study or type(estimator).__name__, f)
            out.params[f] = tune(model, X[train], y_train, n_trials=tune_trials, seed=tune_seed, callbacks=callbacks,
                                 study_name=name)
            model.set_params(**out.params[f])
        out.models[f] = model.fit(X[train], y_train)
        out.predictions[test] = model.predict(X[test])
        out.spans[f] = (start, time.time())
    return out
