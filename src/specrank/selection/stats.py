"""Paired prompt bootstrap of ratio-of-sums statistics (docs/design.md, reported statistics).

Each resample draws prompts with replacement, with all their rounds, and one
resample's weights apply to every score, budget and split together (paired).
A statistic is a ratio of linear combinations of column totals; its interval is
the percentile interval of the resampled ratios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from specrank.selection.select import SelectionError

ROUNDS = "rounds"  # the implicit column of ones: ratio denominators for per-round means


@dataclass(frozen=True)
class Interval:
    """A point estimate with a bootstrap percentile interval."""

    point: float
    low: float
    high: float

    def __iter__(self):
        return iter((self.point, self.low, self.high))


class PromptBootstrap:
    """Resampling weights over prompts: (n_resamples, n_prompts) multinomial counts, seeded."""

    def __init__(self, prompt_ids, n_resamples: int = 2000, seed: int = 0, level: float = 0.95):
        ids = np.asarray(prompt_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise SelectionError(f"prompt_ids: expected a non-empty 1-D array, got shape {ids.shape}")
        if n_resamples < 1:
            raise SelectionError(f"n_resamples: expected >= 1, got {n_resamples}")
        if not 0 < level < 1:
            raise SelectionError(f"level: expected a value in (0, 1), got {level}")
        self.prompts, self.prompt_index = np.unique(ids, return_inverse=True)
        self.level = level
        p = len(self.prompts)
        draws = np.random.default_rng(seed).integers(0, p, size=(n_resamples, p))
        flat = (np.arange(n_resamples)[:, None] * p + draws).ravel()
        self.weights = np.bincount(flat, minlength=n_resamples * p).reshape(n_resamples, p).astype(np.float64)

    @property
    def n_rounds(self) -> int:
        return len(self.prompt_index)

    def totals(self, columns: Mapping[str, np.ndarray], mask=None) -> "Totals":
        """Column totals over the (masked) rounds, at the data and in every resample."""
        names = list(columns)
        if ROUNDS in names:
            raise SelectionError(f"{ROUNDS}: reserved column name (the implicit round count)")
        values = np.column_stack([_column(columns[k], k, self.n_rounds) for k in names] + [np.ones(self.n_rounds)])
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (self.n_rounds,):
                raise SelectionError(f"mask: expected shape ({self.n_rounds},), got {mask.shape}")
            values = np.where(mask[:, None], values, 0.0)  # NaN in excluded rounds must not leak
        per_prompt = _per_prompt(self.prompt_index, len(self.prompts), values)  # (P, K+1)
        return Totals(names + [ROUNDS], per_prompt.sum(axis=0), self.weights @ per_prompt, self.level, per_prompt)

    def split(self, columns: Mapping[str, np.ndarray], labels) -> dict:
        """{label: Totals} over the rounds carrying each label, all with the same resamples."""
        labels = np.asarray(labels)
        if labels.shape != (self.n_rounds,):
            raise SelectionError(f"labels: expected shape ({self.n_rounds},), got {labels.shape}")
        return {lab: self.totals(columns, labels == lab) for lab in np.unique(labels)}

    def equal_mean_gain(self, draw_values, draw_sizes, pearl_values, pearl_sizes, pct: bool = False) -> Interval:
        """Root-draw minus PEARL-style enlarged to root-draw's mean size, re-matched in every resample.

        ``draw_*`` are (N,) per-round root-draw values and sizes; ``pearl_*`` (N, K) the
        PEARL-style curves over pre-draw budgets 1..K. ``pct`` divides by the matched value.
        """
        n = self.n_rounds
        draw = [_column(draw_values, "draw_values", n), _column(draw_sizes, "draw_sizes", n), np.ones(n)]
        cols = np.column_stack(draw)
        curves = [np.asarray(c, dtype=np.float64) for c in (pearl_values, pearl_sizes)]
        for name, c in zip(("pearl_values", "pearl_sizes"), curves):
            if c.ndim != 2 or c.shape[0] != n:
                raise SelectionError(f"{name}: expected shape ({n}, K), got {c.shape}")
        sums = [_per_prompt(self.prompt_index, len(self.prompts), a) for a in (cols, *curves)]
        point = _matched_gain(*(s.sum(axis=0)[None] for s in sums), pct)[0]
        boot = _matched_gain(*(self.weights @ s for s in sums), pct)
        return _interval(point, boot, self.level)


def _column(x, name: str, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.shape != (n,):
        raise SelectionError(f"{name}: expected shape ({n},), got {a.shape}")
    return a


def _per_prompt(index: np.ndarray, n_prompts: int, values: np.ndarray) -> np.ndarray:
    """(P, K) per-prompt sums of (N, K) per-round values."""
    return np.column_stack([np.bincount(index, weights=v, minlength=n_prompts) for v in values.T])


def _matched_gain(draw: np.ndarray, values: np.ndarray, sizes: np.ndarray, pct: bool) -> np.ndarray:
    """(R,) gain over the PEARL-style curve mixed to each resample's root-draw mean size.

    ``draw`` (R, 3) totals of root-draw value, size and rounds; ``values``/``sizes`` (R, K) curve totals.
    """
    n = draw[:, 2:3]
    target = draw[:, 1:2] / n  # (R, 1) root-draw mean size
    means = sizes / n  # (R, K) non-decreasing in the budget
    hi = np.clip((means < target).sum(axis=1), 1, means.shape[1] - 1)[:, None]  # first column >= target
    lo_m, hi_m = np.take_along_axis(means, hi - 1, 1), np.take_along_axis(means, hi, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(hi_m > lo_m, (target - lo_m) / (hi_m - lo_m), 1.0)
    w = np.where(target > means[:, -1:], np.nan, np.clip(w, 0.0, 1.0))  # unreachable: no match
    matched = ((1 - w) * np.take_along_axis(values, hi - 1, 1) + w * np.take_along_axis(values, hi, 1)) / n
    gain = draw[:, 0:1] / n - matched
    return (100 * gain / matched if pct else gain)[:, 0]


def _interval(point: float, boot: np.ndarray, level: float) -> Interval:
    tail = 100 * (1 - level) / 2
    boot = np.where(np.isfinite(boot), boot, np.nan)  # a resample whose denominator is 0 has no ratio
    if np.isnan(boot).all():
        return Interval(float(point), np.nan, np.nan)
    low, high = np.nanpercentile(boot, [tail, 100 - tail])
    return Interval(float(point), float(low), float(high))


@dataclass(frozen=True)
class Totals:
    """Column totals: ``point`` (K,) at the data, ``boot`` (R, K) per resample, for ratio statistics."""

    names: list
    point: np.ndarray
    boot: np.ndarray
    level: float
    per_prompt: np.ndarray

    def _vec(self, coefs) -> np.ndarray:
        v = np.zeros(len(self.names))
        for name, c in coefs:
            if name not in self.names:
                raise SelectionError(f"column: unknown column {name!r}")
            v[self.names.index(name)] += c
        return v

    def ratio(self, num, den, scale: float = 1.0) -> Interval:
        """scale * (sum_k num_k T_k) / (sum_k den_k T_k) with its percentile interval.

        ``num`` and ``den`` are sequences of (column, coefficient) pairs; repeated columns add up.
        """
        a, b = self._vec(num), self._vec(den)
        with np.errstate(invalid="ignore", divide="ignore"):
            point = scale * (self.point @ a) / (self.point @ b)
            boot = scale * (self.boot @ a) / (self.boot @ b)
        return _interval(point, boot, self.level)

    def mean(self, col: str) -> Interval:
        """Per-round mean of ``col``."""
        return self.ratio([(col, 1)], [(ROUNDS, 1)])

    def gain(self, col: str, base: str) -> Interval:
        """Per-round mean of ``col - base`` (in tokens)."""
        return self.ratio([(col, 1), (base, -1)], [(ROUNDS, 1)])

    def gain_pct(self, col: str, base: str) -> Interval:
        """Gain in % of ``base``'s value."""
        return self.ratio([(col, 1), (base, -1)], [(base, 1)], scale=100.0)

    def share(self, col: str, base: str, top: str) -> Interval:
        """Share (%) of ``top``'s advantage over ``base`` that ``col`` recovers."""
        return self.ratio([(col, 1), (base, -1)], [(top, 1), (base, -1)], scale=100.0)


def quintile_labels(x) -> np.ndarray:
    """int (N,) quintile 0..4 of each round's value (e.g. root-row entropy), by quantiles over rounds."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or np.isnan(x).any():
        raise SelectionError("entropy: expected a 1-D array without NaN")
    edges = np.quantile(x, [0.2, 0.4, 0.6, 0.8])
    return np.searchsorted(edges, x, side="right")


def score_table(boot: PromptBootstrap, values: Mapping[str, np.ndarray], budgets, labels=None,
               base: str = "draft", oracle: str = "oracle", root: str = "root"):
    """Long DataFrame, one row per (split, score, budget): mean, gain, gain %, oracle and root shares.

    ``values`` maps each score to per-round values (N, len(budgets)); ``labels`` (N,) splits
    the rounds (first-token agreement, entropy quintile, task), all splits sharing resamples.
    Shares are omitted (NaN) where the score is the reference itself.
    """
    budgets = list(budgets)
    if base not in values:
        raise SelectionError(f"values: the base score {base!r} is missing")
    columns = {}
    for score, v in values.items():
        v = np.asarray(v, dtype=np.float64).reshape(boot.n_rounds, -1)
        if v.shape[1] != len(budgets):
            raise SelectionError(f"values: {score!r} has {v.shape[1]} budgets, expected {len(budgets)}")
        columns.update({f"{score}@{b}": v[:, j] for j, b in enumerate(budgets)})
    splits = {"all": boot.totals(columns)} if labels is None else boot.split(columns, labels)
    rows = []
    for split, tot in splits.items():
        for score in values:
            for b in budgets:
                col, ref = f"{score}@{b}", f"{base}@{b}"
                stats = {"mean": tot.mean(col), "gain": tot.gain(col, ref), "gain_pct": tot.gain_pct(col, ref)}
                for name, top in (("oracle_share", oracle), ("root_share", root)):
                    if top in values and score not in (top, base):
                        stats[name] = tot.share(col, ref, f"{top}@{b}")
                row = {"split": split, "score": score, "budget": b, "rounds": int(tot.point[-1])}
                for name, iv in stats.items():
                    row.update({name: iv.point, f"{name}_low": iv.low, f"{name}_high": iv.high})
                rows.append(row)
    return pd.DataFrame(rows)
