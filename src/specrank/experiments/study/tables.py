"""A study's figures, gathered from recorded rounds and cross-fitted predictions into one results JSON.

Per temperature and budget (8 and 59): expected accepted draft tokens per round of draft selection, the
calibrated controls (isotonic first factor, per-depth calibration of every factor), the Base and Rows
rerankers, Rows with its deeper factors calibrated per depth, root selection and the oracle; each score's
gain over draft with a paired prompt-bootstrap interval and its share of root selection's gain; Rows - Base;
the held-out squared error of every first-factor estimate; a learning curve over training rounds; and what
limits Rows (how often each retained row exists, the gain exact rows could buy at best, feature
importances). ``render_results`` turns the JSON into the Markdown page, byte for byte the same each time.

Every interval comes from one ``PromptBootstrap`` per temperature, so all scores share their resamples.
The paper's numbers (target-row reuse, arXiv 2610.29210, Table 4 and App. D.8) stand beside ours.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specrank.evaluation.data import Rounds, align_predictions
from specrank.evaluation.names import full_label, of_kind
from specrank.evaluation.offline import first_factor_table
from specrank.evaluation.values import per_depth_edges, score_inputs, score_values
from specrank.featurize.context import previous_acceptance, prompt_index
from specrank.featurize.rows import ROW_SOURCES
from specrank.law import GREEDY, Law
from specrank.markdown import interval_cell as _ci
from specrank.experiments.study.tasks import task_figures, task_section
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


def learning_curve_figure(results: dict, path) -> None:
    """Rows - Base (% of draft's value, with its interval) and the Rows share of root's gain against training
    rounds, one panel per temperature, one line per budget; saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = results["temperatures"]
    fig, axes = plt.subplots(2, len(temps), figsize=(5 * len(temps), 6.5), squeeze=False, sharex="col")
    for col, (t, r) in enumerate(temps.items()):
        x = [p["training_rounds"] for p in r["learning_curve"]]
        for b in r["budgets"]:
            diff = np.array([p["budgets"][b]["rows_minus_base_pct_of_draft"] for p in r["learning_curve"]])
            share = [p["budgets"][b]["rows_root_share"][0] for p in r["learning_curve"]]
            axes[0, col].errorbar(x, diff[:, 0], yerr=[diff[:, 0] - diff[:, 1], diff[:, 2] - diff[:, 0]], marker="o",
                                  capsize=3, label=f"B = {b}")
            axes[1, col].plot(x, share, marker="o", label=f"B = {b}")
        axes[0, col].axhline(0, color="grey", lw=0.8)
        axes[0, col].set_title(f"{temperature_name(t)} ({results['drafter']})")
        axes[0, col].set_ylabel("Rows − Base, % of draft's value")
        axes[1, col].set_ylabel("Rows share of root's gain, %")
        axes[1, col].set_xlabel("training rounds per fold model")
        axes[0, col].legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------
# The Markdown page


def temperature_name(t: str) -> str:
    return GREEDY if Law(float(t)).greedy else f"T = {float(t):g}"


def scores_table(budget: str, figures: dict, champion: str | None = None) -> list[str]:
    """One budget's scores: value, gain over draft, % of draft and share of root's gain with their intervals, the
    paper's bound beside Rows; ``champion``, where given, is marked."""
    paper = PAPER["rows_root_share_max"][budget] if budget in PAPER["rows_root_share_max"] else None
    lines = ["| Score | accepted draft tokens / round | gain over draft [95% CI] | % of draft [95% CI] "
             "| share of root's gain, % [95% CI] | paper |", "|---|---|---|---|---|---|"]
    for score, r in figures["scores"].items():
        gain = _ci(r["gain"], 3) if "gain" in r else "–"
        pct = _ci(r["gain_pct"], 1) if "gain_pct" in r else "–"
        share = _ci(r["root_share"], 1, sign=False) if "root_share" in r else "–"
        ref = f"≤ {paper:g}%" if score == "rows" and paper is not None else ""
        name = full_label(score) + (" (champion)" if score == champion else "")
        lines.append(f"| {name} | {r['mean'][0]:.3f} | {gain} | {pct} | {share} | {ref} |")
    return lines


ONLINE_LABELS = {"draft": "Draft selection", "reranked": "Champion", "root": "Root selection (root pass)",
                 "root_draw": "Root-draw selection"}


def online_section(results: dict) -> list[str]:
    """The page's "Offline vs online" tables: per temperature and budget, each strategy decoded in the loop on
    prompts the study never recorded, beside the offline prediction for the same score."""
    out = ["Each temperature's champion (the deployable reranker with the best cross-fitted gain, refitted on all its "
           "rounds) decodes prompts the study never recorded, in the loop, against draft selection, root selection "
           "(a separate root pass) and root-draw selection, every strategy on every prompt in a rotated order. "
           "Realized is the mean accepted draft tokens a round; expected is the exact expectation of the strategy's "
           "own trees at the same online contexts; offline is the cross-fitted prediction at the recorded contexts. "
           "Gains are over draft selection, speeds are tokens/s over draft selection on this machine (paired prompt "
           "bootstrap). Break-even: the gain in accepted tokens a round at which the champion's own per-round cost "
           "(features and inference, measured here) pays on a 14.5 ms GPU round, (1 + draft's acceptance) × cost / "
           "14.5 ms."]
    for t, r in results["temperatures"].items():
        online = r.get("online")
        if not online:
            continue
        for b, f in online["budgets"].items():
            offline_draft = f.get("offline", {}).get("draft", {}).get("mean", [float("nan")])[0]
            out += ["", f"### {temperature_name(t)}, B = {b}: {f['prompts']} unseen prompts; champion "
                        f"{full_label(online['reranker'])}", "",
                    "| Strategy | realized [95% CI] | expected at the online contexts | realized gain over draft "
                    "[95% CI] | offline gain over draft [95% CI] | tokens/s over draft [95% CI] |",
                    "|---|---|---|---|---|---|"]
            for name, e in f["strategies"].items():
                gain = _ci(e["realized_gain"], 3) if "realized_gain" in e else "–"
                off = f.get("offline", {}).get(name, {})
                offline_gain = _ci(off["gain"], 3) if "gain" in off else "–"
                label = ONLINE_LABELS.get(name, name) + (" (pipelined)" if name == "root_draw" and
                                                         online.get("root_draw_pipelined") else "")
                out.append(f"| {label} | {_ci(e['realized'], 3, sign=False)} | {e['expected'][0]:.3f} | {gain} | "
                           f"{offline_gain} | {_ci(e['speed'], 3, sign=False)} |")
            be = f["break_even"]
            out += ["", f"Draft selection accepts {f['strategies']['draft']['realized'][0]:.3f} draft tokens a round "
                        f"online here ({offline_draft:.3f} offline). Champion's cost {be['rerank_ms']:.3f} ms a round: "
                        f"break-even gain on a {be['round_ms']:g} ms GPU round {be['gain']:.4f} tokens a round."]
    return out


# Accepted draft tokens a round of draft selection with EAGLE-3's tree (B = 59), by target and task, in the paper: its
# rounds emit 3.22 to 5.51 tokens greedy and 3.08 to 4.53 sampled, the continuation included (target-row reuse,
# arXiv 2610.29210, App. D.1, Table 8).
PAPER_DRAFT_ACCEPTED = {"greedy": (2.22, 4.51), "sampling": (2.08, 3.53)}  # by the law's name


def _regime(r: dict) -> str:
    """The regime line beside the paper column: how much draft selection accepts here, and in the paper."""
    means = ", ".join(f"{f['scores']['draft']['mean'][0]:.3f} at B = {b}" for b, f in r["budgets"].items())
    low, high = PAPER_DRAFT_ACCEPTED[r["law"]]
    return (f"Regime: draft selection accepts {means} draft tokens a round here; the paper's targets (Llama-3.1-8B, "
            f"Qwen3-4B and 8B, Qwen2.5-7B, 14B and 32B, each with its EAGLE-3 head) accept {low:.2f} to {high:.2f} "
            "at B = 59 (App. D.1, Table 8). A share of root's gain here and a share there come from different "
            "regimes: compare them knowing it.")


TITLE = "Does the reranker help? The study"


def _temperature_section(t: str, r: dict) -> list[str]:
    """One temperature's section of the results page: each budget's scores, the first-factor errors, the learning
    curve, the rows' availability and the rerankers' feature importance."""
    out = ["", f"## {temperature_name(t)}: {r['rounds']} rounds, {r['prompts']} prompts", "", _regime(r), ""]
    for b, figures in r["budgets"].items():
        out += [f"### B = {b}", ""] + scores_table(b, figures) + [""]
        rb = figures.get("rows_minus_base")
        if rb:
            low = PAPER["rows_minus_base_low_min"].get(b)
            paper = f" (paper: lower end ≥ {low:g}% in every run)" if low is not None else ""
            out.append(f"**Rows − Base: {_ci(rb['gain'], 4)} tokens a round, {_ci(rb['gain_pct_of_draft'], 2)}% of "
                       f"draft selection's value**{paper}.")
        if "root_share_in_full_address_rounds" in figures:
            out.append(f"Root selection's gain made in rounds that hold the exact next-root row (the previous round "
                       f"was covered): {_ci(figures['root_share_in_full_address_rounds'], 1, sign=False)}% of it.")
        out.append("")
    if r.get("tasks"):
        out += task_section(r["tasks"], r.get("champion", {}).get("reranker", "rows")) + [""]
    out += ["### First-factor estimates: held-out squared error", "",
            "| Estimate | squared error / candidate [95% CI] | % of draft's [95% CI] | top-1 hit % |", "|---|---|---|---|"]
    for name, e in r["first_factor"].items():
        out.append(f"| {full_label(name)} | {_ci(e['mse'], 5, sign=False)} | "
                   f"{_ci(e['mse_pct_of_draft'], 1, sign=False)} | {e['top1_hit_pct']:.1f} |")
    out += ["", "Paper: the Rows reranker's squared error is below the draft probabilities' and Base's in every run.",
            "", "### Learning curve", "",
            "| training rounds per fold model | B | Rows − Base, % of draft [95% CI] | Rows share of root's gain, % "
            "| Base share, % |", "|---|---|---|---|---|"]
    for point in r["learning_curve"]:
        for b, f in point["budgets"].items():
            out.append(f"| {point['training_rounds']} ({point['fraction']:g} of the training prompts) | {b} | "
                       f"{_ci(f['rows_minus_base_pct_of_draft'], 2)} | {f['rows_root_share'][0]:.1f} | "
                       f"{f['base_root_share'][0]:.1f} |")
    out += ["", "### What the rows are", "",
            "| retained row | rounds that have it, % |", "|---|---|"]
    for name, pct in r["row_availability_pct"].items():
        out.append(f"| {name.replace('_', ' ')} | {pct:.1f} |")
    for name, imp in r["feature_importance"].items():
        if imp:
            top = ", ".join(f"{f} {v:.1f}%" for f, v in imp[:8])
            out += ["", f"{full_label(name)}: share of the trees' total gain by feature: {top}."]
    return out


def render_results(results: dict, figure: str | None = None, title: str = TITLE) -> str:
    """The study's Markdown page from its results JSON (deterministic: the same JSON gives the same bytes);
    ``figure`` is the learning-curve image's path relative to the page."""
    s = results["settings"]
    out = [
        f"# {title}",
        "",
        "Generated by `specrank study` from its results JSON; do not edit by hand.",
        "",
        f"- Command: `{results['command']}`",
        f"- Commit: `{results['commit']}`; machine: {results['machine']}",
        f"- Target: `{results['target']}`; drafter: `{results['drafter']}`",
        f"- Prompts: {results['prompts']['file']} ({results['prompts']['available']} prompts; "
        f"{results['prompts']['skipped_too_long']} too long for the target's context skipped), "
        f"{s['max_new_tokens']} new tokens each, pool of {s['pool_size']}, {s['bootstrap']} paired prompt-bootstrap "
        f"resamples, Optuna trials per fold: {s['tune_trials']}",
        "- None of these prompts is among the head's training prompts (checked by their digests).",
        "",
        "Values are expected accepted draft tokens per round at the same recorded contexts; gains are over draft "
        "selection; a share is the part of root selection's gain a score recovers. Every learned score is "
        "cross-fitted: no prompt's rounds are scored by a model that saw them. The paper column gives what the "
        "target-row reuse paper (arXiv 2610.29210, Table 4 and App. D.8) reports over its six targets.",
    ]
    for t, r in results["temperatures"].items():
        out += _temperature_section(t, r)
    if any("online" in r for r in results["temperatures"].values()):
        out += ["", "## Offline vs online", ""] + online_section(results)
    if figure:
        out += ["", "## Learning curve", "", f"![Rows − Base and the Rows share against training rounds]({figure})"]
    if results.get("findings"):
        out += ["", "## Findings", ""] + [f"- {line}" for line in results["findings"]]
    return "\n".join(out) + "\n"
