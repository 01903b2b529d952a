"""A study's results page: ``results.json`` rendered as Markdown, byte for byte the same each time, and its
learning-curve figure. The paper's numbers (target-row reuse, arXiv 2610.29210, Table 4 and App. D.8) stand beside
ours."""

from __future__ import annotations


import numpy as np

from specrank.evaluation.names import full_label
from specrank.experiments.study.study_tables import PAPER
from specrank.experiments.study.tasks import task_section
from specrank.law import GREEDY, Law
from specrank.markdown import interval_cell as _ci

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
