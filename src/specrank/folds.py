"""Folds of cross-fitting (App. D.8): which prompts each model may see, and the splits every cross-fit walks
(rerankers' fold models, per-depth calibration, the mixtures' weights, the token prior, the tuner's inner
search)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from specrank import schema


class FoldError(ValueError):
    """A fold assignment that would let a model score a prompt it saw."""


def fold_of(prompt_index) -> np.ndarray:
    """The cross-fitting half of each prompt index: even prompts in fold 0, odd in fold 1 (App. D.8)."""
    return np.asarray(prompt_index) % 2


def fold_labels(X, folds=None) -> np.ndarray:
    """Fold of every row: ``X["fold"]`` (None), a column name, a function of ``prompt_index``, or an array.

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
    prompts, prompt = np.unique(np.asarray(X["prompt_id"]), return_inverse=True)
    pairs = np.unique(np.stack([prompt.reshape(-1), np.unique(fold, return_inverse=True)[1].reshape(-1)]), axis=1)
    per_prompt = np.bincount(pairs[0], minlength=len(prompts))  # folds each prompt's rows fall in
    if (per_prompt > 1).any():
        raise FoldError(f"folds: prompt {prompts[per_prompt.argmax()]} spans several folds")
    if len(np.unique(fold)) < 2:
        raise FoldError("folds: cross-fitting needs at least two folds")
    return fold


def fold_splits(fold) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
    """(fold value, its training rows, its held-out rows) for each fold in order: whatever is fitted or chosen
    for fold F sees only the other folds' rows, and is applied to F's."""
    fold = np.asarray(fold)
    for f in np.unique(fold):  # two folds in the paper
        yield f, fold != f, fold == f
