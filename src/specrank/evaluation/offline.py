"""Offline evaluation of every selection score on the same recorded rounds (docs/design.md, selection scores; target-row
reuse, arXiv 2610.29210, App. D.8, D.12).

``evaluate`` turns rounds + cross-fitted first-factor predictions into tables: values and
gains over the budget sweep with paired prompt-bootstrap intervals, splits by first-token
agreement / root-entropy quintile / task, first-factor errors and top-1 hit rates, the
chosen mixture weights, and paired gains between rerankers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from specrank.atomic import atomic_write
from specrank.evaluation.data import Rounds, align_predictions, load_rounds, read_predictions
from specrank.evaluation.values import (
    BUDGET_SWEEP,
    HEADLINE_BUDGETS,
    check_budgets,
    mixture_values,
    score_inputs,
    score_values,
)
from specrank.featurize.rows import ROW_SOURCES
from specrank.featurize.storage import check_same_rounds, rounds_digest, rounds_of
from specrank.files import DataFileError, read_json, read_table
from specrank.law import Law
from specrank.selection.scores import first_token_agreement
from specrank.selection.stats import PromptBootstrap, quintile_labels, score_table

TABLES = ("summary", "splits", "first_factor", "comparisons", "mixture_weights")


@dataclass
class Evaluation:
    """The tables of one offline evaluation and what produced them (``meta``)."""

    summary: pd.DataFrame  # score x budget over all rounds
    splits: pd.DataFrame  # split_kind x group x score x headline budget
    first_factor: pd.DataFrame  # estimate: squared error and top-1 hit rate
    comparisons: pd.DataFrame  # paired gains between rerankers
    mixture_weights: pd.DataFrame  # weight chosen for each half, source and budget
    meta: dict = field(default_factory=dict)
    path: Path | None = None  # the folder it was saved in or read from
    logged_models: dict = field(default_factory=dict)  # "NAME-foldF" -> URI, of the call that logged them

    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in TABLES}


def evaluate(rounds: Rounds, first_factors: dict[str, np.ndarray], budgets=None, n_boot: int = 2000,
             seed: int = 0, level: float = 0.95) -> Evaluation:
    """Evaluate every score on ``rounds``; ``first_factors`` maps reranker names to (N, topk) predictions."""
    m = rounds.pool.shape[1]
    budgets = check_budgets([b for b in BUDGET_SWEEP if b <= m] if budgets is None else budgets, m)
    if n_boot < 1:
        raise ValueError(f"bootstrap: expected at least 1 resample, got {n_boot}")
    scores = score_inputs(rounds, first_factors)
    values = score_values(rounds, scores, budgets)
    mixed, weights = mixture_values(rounds, budgets)
    values.update(mixed)
    boot = PromptBootstrap(rounds.prompt_id, n_resamples=n_boot, seed=seed, level=level)
    summary = score_table(boot, values, budgets).drop(columns="split")
    headline = [b for b in budgets if b in HEADLINE_BUDGETS] or list(budgets)
    calibrated = dict(first_factors, per_depth=scores["per_depth"][1]["edge_factor"][:, : rounds.topk])
    meta = {
        "law": rounds.law,
        "drafter": rounds.manifest.get("drafter"),  # named in the figures' captions
        "rounds": rounds.n_rounds,
        "prompts": int(len(np.unique(rounds.prompt_id))),
        "tasks": sorted(set(rounds.task)),
        "pool_size": m,
        "topk": rounds.topk,
        "budgets": list(budgets),
        "headline_budgets": headline,
        "rerankers": list(first_factors),
        "scores": list(values),
        "bootstrap": n_boot,
        "seed": seed,
        "level": level,
    }
    return Evaluation(
        summary=summary,
        splits=split_table(boot, rounds, values, budgets, headline),
        first_factor=first_factor_table(boot, rounds, calibrated),
        comparisons=comparison_table(boot, values, list(first_factors), budgets),
        mixture_weights=_weights_frame(weights, budgets),
        meta=meta,
    )


def split_labels(rounds: Rounds) -> dict[str, np.ndarray]:
    """Split kind -> (N,) group label: first-token agreement, root-entropy quintile, task, cross-fitting fold."""
    agree = first_token_agreement(rounds.pool)
    return {
        "agreement": np.where(agree, "agree", "differ"),
        "entropy_quintile": np.char.add("Q", (quintile_labels(rounds.root_entropy) + 1).astype(str)),
        "task": rounds.task,
        "fold": rounds.fold.astype(str),
    }


def split_table(boot, rounds: Rounds, values: dict, budgets, headline) -> pd.DataFrame:
    """``score_table`` for each split kind at the headline budgets, with each group's share of rounds."""
    cols = [list(budgets).index(b) for b in headline]
    picked = {score: v[:, cols] for score, v in values.items()}
    frames = []
    for kind, labels in split_labels(rounds).items():
        table = score_table(boot, picked, headline, labels=labels).rename(columns={"split": "group"})
        table.insert(0, "split_kind", kind)
        table["round_share"] = table["rounds"] / rounds.n_rounds
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


def first_factor_estimates(rounds: Rounds, calibrated: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Estimate name -> (N, topk) first-factor estimate: draft q1, rerankers, controls, retained rows.

    A retained row's estimate is its softmax probability (absent entries of a present row: 0);
    rounds without the row keep q1, as its substitution score does.
    """
    q1 = rounds.pool.q_edge[:, : rounds.topk].astype(np.float64)
    out = {"draft": q1, **calibrated}
    for source in ROW_SOURCES:
        logp = rounds.rows[source]
        present = ~np.isnan(logp).all(axis=1, keepdims=True)
        out[f"subst_{source}"] = np.where(present, np.exp(np.nan_to_num(logp, nan=-np.inf)), q1)
    return out


def first_factor_table(boot, rounds: Rounds, calibrated: dict[str, np.ndarray]) -> pd.DataFrame:
    """Held-out squared error per first-level candidate and top-1 hit rate of each estimate.

    Top-1 hit: the estimate's top candidate is the target's argmax; greedy runs count only
    rounds whose first level holds the argmax (App. D.8), sampling runs count every round.
    """
    label = rounds.first_label  # (N, k)
    target = rounds.pool.p_argmax_child[:, : rounds.topk] == 1  # (N, k)
    eligible = target.any(axis=1) if Law.of(rounds.law).greedy else np.ones(rounds.n_rounds, dtype=bool)
    estimates = first_factor_estimates(rounds, calibrated)
    cols = {"cands": np.full(rounds.n_rounds, float(rounds.topk)), "eligible": eligible.astype(np.float64)}
    for name, est in estimates.items():
        cols[f"se:{name}"] = ((est - label) ** 2).sum(axis=1)
        top = np.argmax(est, axis=1)[:, None]  # ties: the higher-draft-probability candidate
        cols[f"hit:{name}"] = np.take_along_axis(target, top, axis=1)[:, 0] & eligible
    totals = boot.totals(cols)
    rows = []
    for name in estimates:
        mse = totals.ratio([(f"se:{name}", 1)], [("cands", 1)])
        rel = totals.ratio([(f"se:{name}", 1)], [("se:draft", 1)], scale=100.0)
        hit = totals.ratio([(f"hit:{name}", 1)], [("eligible", 1)], scale=100.0)
        row = {"estimate": name}
        for key, iv in (("mse", mse), ("mse_pct_of_draft", rel), ("top1_hit_pct", hit)):
            row.update({key: iv.point, f"{key}_low": iv.low, f"{key}_high": iv.high})
        rows.append(row)
    return pd.DataFrame(rows)


def comparison_table(boot, values: dict, rerankers: list[str], budgets) -> pd.DataFrame:
    """Paired gains of each reranker over each earlier one and over the isotonic-free draft baseline."""
    frames = []
    for base, score in combinations(rerankers, 2):
        table = score_table(boot, {base: values[base], score: values[score]}, budgets, base=base)
        frames.append(table[table["score"] == score].assign(base=base))
    if not frames:
        return pd.DataFrame(columns=["score", "base", "budget", "gain", "gain_low", "gain_high"])
    keep = ["score", "base", "budget", "rounds", "gain", "gain_low", "gain_high", "gain_pct", "gain_pct_low",
            "gain_pct_high"]
    return pd.concat(frames, ignore_index=True)[keep]


def _weights_frame(weights: dict, budgets) -> pd.DataFrame:
    rows = [
        {"score": score, "half": half, "budget": b, "weight": float(w[half, j])}
        for score, w in weights.items() for half in range(len(w)) for j, b in enumerate(budgets)
    ]
    return pd.DataFrame(rows)


def evaluate_run(run_dir, predictions, **kwargs) -> Evaluation:
    """``evaluate`` on a run directory and a predictions file (or DataFrame)."""
    rounds = load_rounds(run_dir)
    frame = predictions if isinstance(predictions, pd.DataFrame) else read_predictions(predictions)
    where = "predictions" if isinstance(predictions, pd.DataFrame) else f"--predictions {predictions}"
    if rounds_of(frame):  # hashing the shards only when there is a digest to compare with
        check_same_rounds(where, rounds_of(frame), rounds_digest(run_dir), f"run directory {run_dir} holds rounds")
    return evaluate(rounds, align_predictions(rounds, frame), **kwargs)


def save_evaluation(evaluation: Evaluation, out_dir) -> list[Path]:
    """Write every table as Parquet and CSV plus ``meta.json`` under ``out_dir`` (each file atomic)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in evaluation.tables().items():
        written.append(atomic_write(out / f"{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False)))
        written.append(atomic_write(out / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False)))
    text = json.dumps(evaluation.meta, indent=1)
    written.append(atomic_write(out / "meta.json", lambda p: Path(p).write_text(text)))
    return written


def load_evaluation(out_dir) -> Evaluation:
    """Read back the tables written by ``save_evaluation``."""
    out = Path(out_dir)
    missing = [f"{n}.parquet" for n in TABLES if not (out / f"{n}.parquet").is_file()]
    if missing or not (out / "meta.json").is_file():
        raise FileNotFoundError(f"{out}: not an evaluation directory (missing {', '.join(missing) or 'meta.json'})")
    tables = {n: read_table(out / f"{n}.parquet").to_pandas() for n in TABLES}
    meta = read_json(out / "meta.json", "evaluation metadata")
    if not isinstance(meta, dict):
        raise DataFileError(f"{out / 'meta.json'}: not evaluation metadata (a JSON object)")
    return Evaluation(**tables, meta=meta, path=out)
