"""A study's figures, gathered from recorded rounds and cross-fitted predictions into one results JSON.

Per temperature and budget (8 and 59): expected accepted draft tokens per round of draft selection, the
calibrated controls (isotonic first factor, per-depth calibration of every factor), the Base and Rows
rerankers, Rows with its deeper factors calibrated per depth, root selection and the oracle; each score's
gain over draft with a paired prompt-bootstrap interval and its share of root selection's gain; Rows - Base;
the held-out squared error of every first-factor estimate; a learning curve over training rounds; and what
limits Rows (how often each retained row exists, the gain exact rows could buy at best, feature
importances). ``results_page.render_results`` turns the JSON into the Markdown page.

Every interval comes from one ``PromptBootstrap`` per temperature, so all scores share their resamples.
The paper's numbers (target-row reuse, arXiv 2610.29210, Table 4 and App. D.8) stand beside ours.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specrank.evaluation.data import Rounds, align_predictions
from specrank.evaluation.names import of_kind
from specrank.evaluation.offline import first_factor_table
from specrank.evaluation.values import per_depth_edges, score_inputs, score_values
from specrank.experiments.study.tasks import task_figures
from specrank.featurize.context import previous_acceptance, prompt_index
from specrank.featurize.rows import ROW_SOURCES
from specrank.folds import fold_splits
from specrank.rerankers import cross_fit_table
from specrank.rerankers.registry import KINDS
from specrank.selection import stacked_factors
from specrank.selection.stats import PromptBootstrap

# B = 1 is the top-1 choice: the single first token a chain drafts from (serving engines' chains choose exactly that)
STUDY_BUDGETS = (1, 8, 59)
RERANKERS = tuple(n for n, k in KINDS.items() if k.table == "features")  # cross-fitted here; per-depth from the edges
STUDY_SCORES = (*of_kind("draft", "control", "reranker"), "root", "oracle")
STACKED = {"rows+per_depth": "rows", "ranking+per_depth": "ranking"}  # a reranker's first factor, every deeper factor calibrated per depth
CURVE_FRACTIONS = (0.25, 0.5, 1.0)
CURVE_SCORES = ("draft", "base", "rows", "root")
ESTIMATES = of_kind("draft", "control", "reranker")
# What the target-row reuse paper (arXiv 2610.29210) reports for its six targets (App. D.8, Table 4).
PAPER = {
    "rows_root_share_max": {"8": 29.0, "59": 33.0},  # Rows recovers at most this % of root's gain
    "rows_minus_base_low_min": {"8": 0.88, "59": 0.30},  # lower 95% end of Rows - Base, % of draft's value
    "rows_minus_draft_low_min": {"8": 0.81, "59": 0.27},  # lower 95% end of Rows - draft, % of draft's value
}


def triple(iv) -> list[float]:
    """[point, low, high] of an interval, as plain floats (JSON)."""
    return [float(iv.point), float(iv.low), float(iv.high)]


def study_values(rounds: Rounds, first_factors: dict[str, np.ndarray], edges: np.ndarray, budgets=STUDY_BUDGETS,
                 scores=STUDY_SCORES) -> dict[str, np.ndarray]:
    """Score -> (N, len(budgets)) expected accepted draft tokens: ``scores`` that have inputs, and the stacked scores;
    ``edges`` (N, M): the rounds' cross-fitted per-depth calibrated factors (``per_depth_edges``)."""
    inputs = score_inputs(rounds, first_factors, edges)
    values = score_values(rounds, {r: inputs[r] for r in scores if r in inputs}, budgets)
    for name, reranker in STACKED.items():
        if reranker in first_factors and "per_depth" in scores:
            stacked = stacked_factors(rounds.pool, first_factors[reranker], edges)
            values[name] = score_values(rounds, {name: ("per_depth", {"edge_factor": stacked})}, budgets)[name]
    return values


def budget_figures(boot: PromptBootstrap, values: dict[str, np.ndarray], budgets=STUDY_BUDGETS,
                   masks: dict[str, np.ndarray] | None = None) -> dict:
    """Per budget: each score's mean, gain and gain % over draft and share of root's gain, and Rows - Base;
    ``masks`` (name -> (N,) bool) add the share of root's gain made in the rounds each mask selects."""
    cols = {f"{r}@{b}": v[:, j] for r, v in values.items() for j, b in enumerate(budgets)}
    for name, mask in (masks or {}).items():
        for j, b in enumerate(budgets):
            cols[f"{name}:root-draft@{b}"] = (values["root"][:, j] - values["draft"][:, j]) * mask
    tot = boot.totals(cols)
    out = {}
    for b in budgets:
        draft, root = f"draft@{b}", f"root@{b}"
        scores = {}
        for score in values:
            col = f"{score}@{b}"
            entry = {"mean": triple(tot.mean(col))}
            if score != "draft":
                entry["gain"] = triple(tot.gain(col, draft))
                entry["gain_pct"] = triple(tot.gain_pct(col, draft))
                if score != "root":
                    entry["root_share"] = triple(tot.share(col, draft, root))
            scores[score] = entry
        figures = {"scores": scores}  # the results JSON's key (docs/results/study.json)
        if "rows" in values and "base" in values:
            pair = [(f"rows@{b}", 1), (f"base@{b}", -1)]
            figures["rows_minus_base"] = {"gain": triple(tot.gain(f"rows@{b}", f"base@{b}")),
                                          "gain_pct_of_draft": triple(tot.ratio(pair, [(draft, 1)], 100.0))}
        for name in masks or {}:
            figures[f"root_share_in_{name}"] = triple(tot.ratio([(f"{name}:root-draft@{b}", 1)],
                                                                [(root, 1), (draft, -1)], 100.0))
        out[str(b)] = figures
    return out


def summary_budget_figures(summary: pd.DataFrame, budgets=STUDY_BUDGETS, scores=STUDY_SCORES) -> dict:
    """``budget_figures``' shares of root's gain read off an evaluation's summary (score x budget, with
    ``root_share_low`` / ``_high``), for the ``scores`` it holds at ``budgets``: the same form a study's figures
    take, from an evaluation that already drew its intervals."""
    out = {}
    for b in budgets:
        at = summary[summary["budget"] == b].set_index("score")
        shares = {}
        for score in (s for s in scores if s in at.index):
            share = [float(at.loc[score, k]) for k in ("root_share", "root_share_low", "root_share_high")]
            shares[score] = {"root_share": share} if not np.isnan(share).all() else {}
        out[str(b)] = {"scores": shares}  # the results JSON's key, as budget_figures writes it
    return out


def estimate_errors(boot: PromptBootstrap, rounds: Rounds, first_factors: dict[str, np.ndarray],
                    edges: np.ndarray) -> dict:
    """Held-out squared error per first-level candidate (and % of draft's) of each estimate of ``ESTIMATES``."""
    calibrated = dict(first_factors, per_depth=edges[:, : rounds.topk])
    table = first_factor_table(boot, rounds, calibrated).set_index("estimate")
    return {name: {"mse": [float(table.loc[name, k]) for k in ("mse", "mse_low", "mse_high")],
                   "mse_pct_of_draft": [float(table.loc[name, k]) for k in
                                        ("mse_pct_of_draft", "mse_pct_of_draft_low", "mse_pct_of_draft_high")],
                   "top1_hit_pct": float(table.loc[name, "top1_hit_pct"])}
            for name in ESTIMATES if name in table.index}


def row_availability(rounds: Rounds, covered: pd.DataFrame) -> dict[str, np.ndarray]:
    """(N,) bool per retained row: whether the round's first-level candidates have it. ``full_address`` is the
    exact next root row, kept when the previous round was covered (``covered``: prompt_id, round, covered)."""
    out = {source: ~np.isnan(rounds.rows[source]).all(axis=1) for source in ROW_SOURCES}
    keys = pd.DataFrame({"prompt_id": rounds.prompt_id, "round": rounds.round})
    table = keys.merge(covered[["prompt_id", "round", "covered"]], on=["prompt_id", "round"], how="left",
                       validate="one_to_one")
    prev = previous_acceptance(rounds.prompt_id, rounds.round, table["covered"].to_numpy(dtype=np.float64))
    out["full_address"] = np.nan_to_num(prev, nan=0.0) > 0
    return out


def feature_importances(models: list, top: int = 12) -> list[list]:
    """[[feature, share of total gain %], ...] averaged over the fold models of one GBM reranker (LightGBM)."""
    shares = []
    for model in models:
        booster = getattr(model, "model_", None)
        if not hasattr(booster, "feature_importance"):
            return []
        gain = np.asarray(booster.feature_importance(importance_type="gain"), dtype=np.float64)
        shares.append(pd.Series(100.0 * gain / max(gain.sum(), 1e-300), index=model.features_))
    mean = pd.concat(shares, axis=1).fillna(0.0).mean(axis=1).sort_values(ascending=False, kind="stable")
    return [[name, float(v)] for name, v in mean.head(top).items()]


def curve_subset(prompt_idx: np.ndarray, train: np.ndarray, held_out: int, fraction: float, seed: int) -> np.ndarray:
    """(n,) bool: the ``train`` rows of the model that predicts fold ``held_out``, keeping ``fraction`` of their
    prompts (a seeded draw, the same for every reranker)."""
    prompts = np.unique(prompt_idx[train])
    keep = np.random.default_rng(seed + int(held_out)).permutation(prompts)[: max(1, math.ceil(fraction * len(prompts)))]
    return train & np.isin(prompt_idx, keep)


def learning_curve(rounds: Rounds, features: pd.DataFrame, fold_models: dict[str, dict[int, object]],
                   predictions: pd.DataFrame, edges: np.ndarray, n_boot: int, seed: int = 0, fractions=CURVE_FRACTIONS,
                   budgets=STUDY_BUDGETS) -> list[dict]:
    """Rows - Base and the Rows share of root's gain with each fold's models refitted on a fraction of its
    training prompts (the fold models' own hyper-parameters); fraction 1 is ``predictions`` itself."""
    pidx, fold = prompt_index(features["prompt_id"].to_numpy()), features["fold"].to_numpy()
    boot = PromptBootstrap(rounds.prompt_id, n_resamples=n_boot, seed=seed)
    points = []
    for fraction in fractions:
        preds = predictions[["prompt_id", "task", "round", "cand"]].copy()

        def subset(f, train, fraction=fraction):
            return curve_subset(pidx, train, f, fraction, seed)

        for name in ("base", "rows"):
            preds[name] = (predictions[name].to_numpy() if fraction == 1.0 else
                           cross_fit_table(fold_models[name], features, folds=fold, fit_rows=subset).predictions)
        used = [len(features.loc[train if fraction == 1.0 else subset(f, train), ["prompt_id", "round"]]
                    .drop_duplicates()) for f, train, _ in fold_splits(fold)]
        values = study_values(rounds, align_predictions(rounds, preds), edges, budgets, scores=CURVE_SCORES)
        figures = budget_figures(boot, {r: values[r] for r in CURVE_SCORES}, budgets)
        points.append({
            "fraction": fraction,
            "training_rounds": int(round(float(np.mean(used)))),
            "budgets": {b: {"rows_minus_base_pct_of_draft": f["rows_minus_base"]["gain_pct_of_draft"],
                            "rows_root_share": f["scores"]["rows"]["root_share"],
                            "base_root_share": f["scores"]["base"]["root_share"]} for b, f in figures.items()},
        })
    return points


def temperature_results(rounds: Rounds, predictions: pd.DataFrame, features: pd.DataFrame, covered: pd.DataFrame,
                        fold_models: dict[str, dict[int, object]], n_boot: int, seed: int = 0,
                        budgets=STUDY_BUDGETS) -> dict:
    """Every figure of one temperature's study (see the module docstring)."""
    first_factors = align_predictions(rounds, predictions)
    edges = per_depth_edges(rounds)  # once: every score and figure below reads the same cross-fitted factors
    values = study_values(rounds, first_factors, edges, budgets)
    boot = PromptBootstrap(rounds.prompt_id, n_resamples=n_boot, seed=seed)
    available = row_availability(rounds, covered)
    gbm = {name: [models[f] for f in sorted(models)] for name, models in fold_models.items()}
    return {
        "law": rounds.law,
        "rounds": rounds.n_rounds,
        "prompts": int(len(np.unique(rounds.prompt_id))),
        "pool_size": int(rounds.pool.shape[1]),
        "budgets": budget_figures(boot, values, budgets, masks={"full_address_rounds": available["full_address"]}),
        "first_factor": estimate_errors(boot, rounds, first_factors, edges),
        "tasks": task_figures(boot, rounds.task, rounds.prompt_id, values, budgets),
        "learning_curve": learning_curve(rounds, features, fold_models, predictions, edges, n_boot, seed,
                                         budgets=budgets),
        "row_availability_pct": {k: float(100.0 * v.mean()) for k, v in available.items()},
        "feature_importance": {name: feature_importances(models) for name, models in gbm.items()},
    }


# ----------------------------------------------------------------------------------------------------------
# The Markdown page


