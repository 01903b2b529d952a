"""Token prior (docs/design.md, features): mean label of training candidates with the same token, shrunk to the mean."""

from __future__ import annotations

import numpy as np

from specrank.folds import fold_splits


def _shrunk_table(tokens, labels, pseudo_count: float):
    """(distinct tokens, shrunk means, overall mean) of ``labels`` grouped by ``tokens``."""
    labels = np.asarray(labels, dtype=np.float64)
    overall = float(labels.mean()) if len(labels) else 0.0
    uniq, inv = np.unique(np.asarray(tokens, dtype=np.int64), return_inverse=True)
    count = np.bincount(inv, minlength=len(uniq))
    total = np.bincount(inv, weights=labels, minlength=len(uniq))
    return uniq, (total + pseudo_count * overall) / (count + pseudo_count), overall


def _lookup(table_tokens, table_means, default, tokens) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(table_tokens) == 0:
        return np.full(len(tokens), default)
    pos = np.clip(np.searchsorted(table_tokens, tokens), 0, len(table_tokens) - 1)
    return np.where(table_tokens[pos] == tokens, table_means[pos], default)


class TokenPrior:
    """Shrunk per-token mean label, learned from a training half; unseen tokens get the overall mean.

    ``fit_transform`` returns the training rows' own priors without their labels: rows are split
    in alternation (row ``i`` goes to part ``i % 2``, table order) and each part's prior comes
    from the other part. ``transform`` (held-out rows, online rounds) uses the whole training half.
    """

    def __init__(self, pseudo_count: float = 20.0):
        self.pseudo_count = pseudo_count

    def fit(self, tokens, labels):
        self.tokens_, self.means_, self.mean_ = _shrunk_table(tokens, labels, self.pseudo_count)
        self.__dict__.pop("table_", None)
        return self

    def transform(self, tokens) -> np.ndarray:
        return _lookup(self.tokens_, self.means_, self.mean_, tokens)

    def lookup(self, tokens) -> np.ndarray:
        """``transform`` of one round's few tokens through a dictionary (built on first use): no array
        searches per round."""
        table = self.__dict__.get("table_")
        if table is None:
            table = self.table_ = dict(zip(self.tokens_.tolist(), self.means_.tolist()))
        return np.array([table.get(t, self.mean_) for t in tokens.tolist()])

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("table_", None)  # rebuilt on first use
        return state

    def fit_transform(self, tokens, labels) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.float64)
        part = np.arange(len(tokens)) % 2
        out = np.empty(len(tokens))
        for _, other, held in fold_splits(part):  # each part's prior from the other part only
            table = _shrunk_table(tokens[other], labels[other], self.pseudo_count)
            out[held] = _lookup(*table, tokens[held])
        self.fit(tokens, labels)
        return out
