"""Cross-fitting is written once: ``specrank.folds.fold_splits`` walks the folds, ``rerankers.cross_fit_table`` fits
and predicts; per-depth calibration, the mixtures' weights, the learning curve and the tuner's inner search use
them instead of splitting folds again."""

import re

import numpy as np
import pandas as pd
from source_grep import source_lines_matching

from specrank.folds import fold_splits
from specrank.rerankers import IsotonicFirstFactor, cross_fit_table

# A fold split written again: rows compared with one fold value, or a loop over hard-coded folds.
SPLITS = re.compile(r"(\b\w*fold\w*\s*[!=]=\s*(f|held_out|fold)\b|for\s+\w+\s+in\s+\(0,\s*1\)|inner\s*[!=]=\s*f\b)")


def test_fold_splits_hold_each_fold_out_once():
    fold = np.array([0, 1, 1, 0, 2])
    seen = [(int(f), train.tolist(), test.tolist()) for f, train, test in fold_splits(fold)]
    assert seen == [(0, [False, True, True, False, True], [True, False, False, True, False]),
                    (1, [True, False, False, True, True], [False, True, True, False, False]),
                    (2, [True, True, True, True, False], [False, False, False, False, True])]


def test_a_fold_model_fits_only_the_rows_it_is_given_and_predicts_its_whole_fold(monkeypatch):
    n = 40
    X = pd.DataFrame({"prompt_id": np.repeat([f"p{i}" for i in range(8)], 5), "q": np.linspace(0.01, 0.99, n)})
    X.attrs["specrank"] = {"label_kind": "probability", "topk": 5}
    y = np.linspace(0, 1, n)
    fold = np.repeat(np.arange(8) % 2, 5)
    fitted_sizes = []
    original = IsotonicFirstFactor.fit

    def fit(self, X, y=None):
        fitted_sizes.append(len(X))
        return original(self, X, y)

    monkeypatch.setattr(IsotonicFirstFactor, "fit", fit)
    labelled = np.arange(n) % 4 != 0
    out = cross_fit_table(IsotonicFirstFactor(), X, y, folds=fold, fit_rows=labelled)
    assert fitted_sizes == [int((labelled & (fold == 1)).sum()), int((labelled & (fold == 0)).sum())]
    assert np.isfinite(out.predictions).all()


def test_folds_are_split_in_one_place():
    assert source_lines_matching(SPLITS, "folds.py") == []


def test_the_split_pattern_finds_a_split():
    assert SPLITS.search("train, test = fold != f, fold == f")
    assert SPLITS.search("for f in (0, 1):")
    assert not SPLITS.search("for f, train, test in fold_splits(fold):")
