"""The Markdown report of an offline evaluation, led by the scores at the headline budgets."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specrank.atomic import atomic_write
from specrank.evaluation.figures import close_figures, render_figures
from specrank.evaluation.html import report_html
from specrank.evaluation.names import CONTROLS, label, ordered, rerankers
from specrank.markdown import markdown_table

SPLIT_TITLES = {
    "agreement": "First-token agreement (drafter's top first token = target's argmax)",
    "entropy_quintile": "Root-row entropy quintile (Q1 lowest)",
    "task": "Task",
    "fold": "Cross-fitting fold (prompt index % 2)",
}


def _num(x, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(row, name: str, digits: int = 3, suffix: str = "") -> str:
    """``point [low, high]`` of a statistic, or a dash where it is undefined."""
    point = row.get(name)
    if point is None or pd.isna(point):
        return "–"
    low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
    return f"{_num(point, digits)}{suffix} [{_num(low, digits)}, {_num(high, digits)}]"


def headline_table(summary: pd.DataFrame, budgets) -> str:
    """Scores x headline budgets: value, gain over draft with 95% interval, % of draft, share of root gain."""
    header = ["Score"]
    for b in budgets:
        header += [f"B={b} value", f"B={b} gain [95% CI]", f"B={b} gain % of draft", f"B={b} root share %"]
    rows = []
    for score in ordered(summary["score"].unique()):
        cells = [label(score)]
        for b in budgets:
            r = summary[(summary["score"] == score) & (summary["budget"] == b)]
            if r.empty:
                cells += ["–"] * 4
                continue
            r = r.iloc[0]
            cells += [_num(r["mean"]), _ci(r, "gain"), _ci(r, "gain_pct", 1), _ci(r, "root_share", 1)]
        rows.append(cells)
    return markdown_table(header, rows)


def sweep_table(summary: pd.DataFrame) -> str:
    """Gain over draft (% of draft's value) for every score over the budget sweep."""
    budgets = sorted(summary["budget"].unique())
    pivot = summary.pivot(index="score", columns="budget", values="gain_pct")
    rows = [[label(r)] + [f"{pivot.loc[r, b]:+.1f}" for b in budgets] for r in ordered(pivot.index) if r != "draft"]
    return markdown_table(["Score"] + [f"B={b}" for b in budgets], rows)


def comparison_section(comparisons: pd.DataFrame, budgets) -> str:
    if comparisons.empty:
        return "Only one reranker column: no paired reranker comparison."
    t = comparisons[comparisons["budget"].isin(budgets)]
    rows = [[f"{label(r['score'])} − {label(r['base'])}", str(r["budget"]), _ci(r, "gain"),
             _ci(r, "gain_pct", 2, "%")]
            for _, r in t.iterrows()]
    return markdown_table(["Paired gain", "B", "tokens [95% CI]", "% of base [95% CI]"], rows)


def first_factor_section(first_factor: pd.DataFrame) -> str:
    rows = [[label(r["estimate"]), _ci(r, "mse", 5), _ci(r, "mse_pct_of_draft", 1), _ci(r, "top1_hit_pct", 1)]
            for _, r in first_factor.iterrows()]
    return markdown_table(["First-factor estimate", "squared error / candidate", "% of draft's", "top-1 hit %"], rows)


def split_section(splits: pd.DataFrame, kind: str, budgets, scores: list[str]) -> str:
    """Per group: share of rounds, root gain, oracle advantage and each reranker's share of the root gain."""
    t = splits[splits["split_kind"] == kind]
    header = ["Group", "rounds %"]
    for b in budgets:
        header += [f"B={b} root gain", f"B={b} oracle gain"] + [f"B={b} {label(r)} root share %" for r in scores]
    rows = []
    for group in sorted(t["group"].unique(), key=str):
        g = t[t["group"] == group]
        cells = [str(group), f"{100 * g['round_share'].iloc[0]:.1f}"]
        for b in budgets:
            at = g[g["budget"] == b].set_index("score")
            cells += [_ci(at.loc[r], "gain") if r in at.index else "–" for r in ("root", "oracle")]
            cells += [_ci(at.loc[r], "root_share", 1) if r in at.index else "–" for r in scores]
        rows.append(cells)
    return markdown_table(header, rows)


def weights_section(weights: pd.DataFrame, budgets) -> str:
    t = weights[weights["budget"].isin(budgets)]
    if t.empty:
        return "No mixtures evaluated."
    rows = [[label(r["score"]), str(r["budget"]), str(r["half"]), f"{r['weight']:.2f}"] for _, r in t.iterrows()]
    return markdown_table(["Mixture", "B", "half scored", "weight (chosen on the other half)"], rows)


def write_report(evaluation, out_dir, figures: dict | None = None) -> str:
    """Write ``figures/*.png``, ``report.md`` and ``report.html`` (the same, figures embedded) under ``out_dir``
    (each file atomic); return the Markdown.

    ``figures`` (name -> Figure) are rendered from the tables (and closed) when not given.
    """
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    owned = figures is None
    figures = render_figures(evaluation.summary, evaluation.splits, evaluation.meta) if owned else figures
    links = {}
    try:
        for name, fig in figures.items():
            atomic_write(out / "figures" / f"{name}.png", lambda p, f=fig: f.savefig(p, dpi=120, format="png"))
            links[name] = f"figures/{name}.png"
    finally:
        if owned:
            close_figures(figures)
    text = render_report(evaluation, links)
    atomic_write(out / "report.md", lambda p: Path(p).write_text(text))
    page = report_html(text, out, title="Offline evaluation of selection scores")
    atomic_write(out / "report.html", lambda p: Path(p).write_text(page))
    return text


def render_report(evaluation, figures: dict[str, str] | None = None) -> str:
    """Markdown report of an ``Evaluation``; ``figures`` maps figure names to relative image paths."""
    meta, summary = evaluation.meta, evaluation.summary
    budgets = meta.get("headline_budgets") or sorted(summary["budget"].unique())[:2]
    learned = [r for r in rerankers(summary["score"].unique()) if r not in CONTROLS]  # split tables stay narrow
    parts = [
        "# Offline evaluation of selection scores",
        f"{meta.get('law', '?')} decoding · {meta.get('rounds', '?')} rounds · {meta.get('prompts', '?')} prompts · "
        f"tasks: {', '.join(meta.get('tasks', []))} · pool of {meta.get('pool_size', '?')} candidates · "
        f"{meta.get('bootstrap', '?')} paired prompt-bootstrap resamples"
        f" ({100 * meta.get('level', 0.95):.0f}% intervals).",
        "Values are expected accepted draft tokens per round on the recorded rounds and pools; gains are over draft "
        "selection; *root share* is the part of root selection's gain a score recovers.",
        f"## Scores at B = {', '.join(str(b) for b in budgets)}",
        headline_table(summary, budgets),
    ]
    captions = {"gain_vs_budget": "Gain over draft vs budget", "root_share_by_task": "Root gain recovered by task"}
    for name, caption in captions.items():
        if figures and name in figures:
            parts.append(f"![{caption}]({figures[name]})")
    parts += [
        "## Gain over draft across budgets (% of draft's value)", sweep_table(summary),
        "## Paired reranker comparisons", comparison_section(evaluation.comparisons, budgets),
        "## First-factor estimates (held out)", first_factor_section(evaluation.first_factor),
    ]
    for kind, title in SPLIT_TITLES.items():
        if kind in set(evaluation.splits["split_kind"]):
            parts += [f"## {title}", split_section(evaluation.splits, kind, budgets, learned)]
    parts += ["## Geometric-mixture weights", weights_section(evaluation.mixture_weights, budgets)]
    return "\n\n".join(parts) + "\n"
