"""Figures of an offline evaluation: gain vs budget per score, recovered share by task, each score's share of root's
gain at the headline budgets, online acceptance and online speed gains.

Figures are built on ``matplotlib.figure.Figure`` without pyplot, so importing or rendering sets
no backend: a notebook that imports ``specrank.evaluation`` keeps its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specrank.evaluation.names import EXACT, RETAINED, label, ordered, rerankers

EAGLE3_TREE = 59  # the size of EAGLE-3's default tree (a dotted reference line, whichever drafter drafted)
FIGURES = ("gain_vs_budget", "root_share_by_task")


# Distinct hues for the scores a reader compares; a mixture shares its row's hue (dashed).
COLORS = {
    "draft": "black", "isotonic": "tab:gray", "per_depth": "tab:olive", "base": "tab:orange", "rows": "tab:blue",
    "root": "tab:green", "depth2": "tab:red", "oracle": "tab:purple",
    "subst_cache": "tab:brown", "subst_same_token": "tab:pink", "subst_preceding": "tab:cyan",
}
SPARE = ("gold", "navy", "teal", "salmon", "lime", "indigo")
BASE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")  # one per base of a speed-gain figure


def new_figure(ncols: int, figsize, **kwargs):
    """(Figure, axes (1, ncols)) without pyplot: no backend is chosen or changed."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(1, ncols, squeeze=False, **kwargs)


def _colors(scores) -> dict[str, str]:
    """One stable colour per score; extra reranker columns take spare colours in reading order."""
    colors = dict(COLORS)
    colors.update({f"mix_{k[len('subst_'):]}": v for k, v in COLORS.items() if k.startswith("subst_")})
    extra = [r for r in ordered(scores) if r not in colors]
    colors.update({r: SPARE[i % len(SPARE)] for i, r in enumerate(extra)})
    return colors


def _gain_panel(ax, summary: pd.DataFrame, scores, colors, title: str) -> None:
    for score in scores:
        t = summary[summary["score"] == score].sort_values("budget")
        if t.empty:
            continue
        ax.plot(t["budget"], t["gain"], marker="o", ms=3, lw=1.6, color=colors[score], label=label(score),
                ls="--" if score.startswith("mix_") else "-")
        ax.fill_between(t["budget"], t["gain_low"], t["gain_high"], color=colors[score], alpha=0.18, lw=0)
    ax.axhline(0.0, color="black", lw=0.8)
    if summary["budget"].min() <= EAGLE3_TREE <= summary["budget"].max():
        ax.axvline(EAGLE3_TREE, color="grey", ls=":", lw=1.2)
    ax.set_xscale("log")
    budgets = sorted(summary["budget"].unique())
    ax.set_xticks(budgets)
    ax.set_xticklabels([str(b) for b in budgets], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("budget B (non-root nodes)")
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)


def gain_vs_budget(summary: pd.DataFrame, meta: dict | None = None):
    """Gain over draft selection vs budget, one line per score with its 95% band; left: exact rows,
    rerankers and controls; right: retained rows substituted or mixed (root for reference)."""
    scores = ordered(summary["score"].unique())
    colors = _colors(scores)
    learned = [r for r in scores if r in EXACT or r in rerankers(scores)]
    retained = ["root"] * ("root" in scores) + [r for r in scores if r in RETAINED]
    panels = [(learned, "Exact rows, rerankers, controls")]
    if len(retained) > 1:
        panels.append((retained, "Rows at other addresses"))
    fig, axes = new_figure(len(panels), (6.2 * len(panels), 4.4), sharey=True)
    for ax, (group, title) in zip(axes[0], panels):
        _gain_panel(ax, summary, group, colors, title)
    axes[0, 0].set_ylabel("gain over draft (accepted draft tokens / round)")
    caption = ("Gain over draft selection; bands: 95% prompt-bootstrap intervals; "
               f"dotted: B = {EAGLE3_TREE}, the size of EAGLE-3's default tree")
    fig.suptitle(_caption(meta, caption), fontsize=10)
    fig.tight_layout()
    return fig


def root_share_by_task(summary: pd.DataFrame, splits: pd.DataFrame, meta: dict | None = None):
    """Share of the root gain each reranker recovers, per task and over all rounds, at the headline budgets."""
    scores = rerankers(summary["score"].unique())
    colors = _colors(summary["score"].unique())
    by_task = splits[splits["split_kind"] == "task"]
    budgets = sorted(by_task["budget"].unique())
    groups = sorted(by_task["group"].unique()) + ["all"]
    panel_width = max(5.0, 0.3 * len(groups) * max(len(scores), 1) + 2.0)
    fig, axes = new_figure(len(budgets), (panel_width * len(budgets), 4.2), sharey=True)
    width = 0.8 / max(len(scores), 1)
    x = np.arange(len(groups))
    ends = []  # every whisker's ends, for the shared y range
    for ax, b in zip(axes[0], budgets):
        whole = summary[summary["budget"] == b].assign(group="all")
        table = pd.concat([by_task[by_task["budget"] == b], whole], ignore_index=True)
        for i, score in enumerate(scores):
            t = table[table["score"] == score].set_index("group").reindex(groups)
            share = t["root_share"].to_numpy(dtype=float)
            low, high = (t[f"root_share_{k}"].to_numpy(dtype=float) for k in ("low", "high"))
            err = np.abs(np.vstack([share - low, high - share]))
            ends += [low, high, share]
            # a group whose root selection gains nothing has no share, and one whose resamples do has no interval:
            # no bar, or no whisker (NaN coordinates upset matplotlib's limits)
            pos, bar, whisker = x + (i - (len(scores) - 1) / 2) * width, np.isfinite(share), np.isfinite(err).all(0)
            ax.bar(pos[bar], share[bar], width, color=colors[score], label=label(score))
            ax.errorbar(pos[whisker], share[whisker], yerr=err[:, whisker], fmt="none", ecolor="black", capsize=2,
                        lw=0.8)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.axhline(100.0, color="grey", ls=":", lw=1.0)
        ax.set_xticks(x)
        ax.set_xticklabels(groups, fontsize=9)
        ax.set_title(f"B = {b}", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("share of the root gain recovered (%)")
    axes[0, 0].legend(fontsize=8, frameon=False, loc="upper left")
    # A task whose root gain is near zero in some resamples has a share interval of hundreds of percent, which
    # would flatten every bar: the range stops at [-100, 200]% and such whiskers run off the plot.
    values = np.concatenate([[0.0, 100.0], *ends])  # 0 and 100% always in range
    values = values[np.isfinite(values)]
    axes[0, 0].set_ylim(max(values.min() - 5.0, -100.0), min(values.max() + 5.0, 200.0))
    caption = ("Share of root selection's gain over draft recovered; whiskers: 95% intervals, cut at -100% and "
               "200%; dotted: 100%")
    fig.suptitle(_caption(meta, caption), fontsize=10)
    fig.tight_layout()
    return fig


def _caption(meta: dict | None, text: str) -> str:
    if not meta:
        return text
    drafter = f"drafter {meta['drafter']}, " if meta.get("drafter") else ""
    run = (f"{drafter}{meta.get('law', '')} decoding, {meta.get('rounds', '?')} rounds, "
           f"{meta.get('prompts', '?')} prompts")
    return f"{text}\n{run}"


def render_figures(summary: pd.DataFrame, splits: pd.DataFrame, meta: dict | None = None) -> dict:
    """Figure name -> matplotlib Figure."""
    return {
        "gain_vs_budget": gain_vs_budget(summary, meta),
        "root_share_by_task": root_share_by_task(summary, splits, meta),
    }


def close_figures(figures: dict) -> None:
    """Release the memory of rendered figures (pyplot never holds them: dropping them frees them)."""
    for fig in figures.values():
        fig.clear()


def acceptance_figure(summary: pd.DataFrame):
    """Bar chart: realized mean acceptance by strategy with intervals, own expected value as a marker."""
    realized = summary[summary["statistic"] == "realized"].reset_index(drop=True)
    fig, axes = new_figure(1, (1.2 * len(realized) + 2, 3.2))
    ax = axes[0, 0]
    x = np.arange(len(realized))
    err = np.vstack([realized["mean"] - realized["low"], realized["high"] - realized["mean"]])
    ax.bar(x, realized["mean"], yerr=err, capsize=4, color="tab:blue", label="realized")
    expected = summary[summary["statistic"] == "expected"].set_index("strategy")["mean"]
    ax.scatter(x, [expected.get(d, np.nan) for d in realized["strategy"]], color="black", marker="_", s=400,
               zorder=3, label="expected (same rounds)")
    ax.set_xticks(x, realized["strategy"])
    ax.set_ylabel("accepted draft tokens / round")
    ax.set_title("Realized acceptance by strategy (95% prompt-bootstrap intervals)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speed_gain_figure(speed: pd.DataFrame, title: str = "Decoding-speed gain", order=None):
    """Speed gains (%) with 95% intervals, one panel per budget, bars per strategy (in ``order`` when given)
    grouped by base (target-row reuse, arXiv 2610.29210, Figure 4). ``speed``: ``speed_ratios`` rows with a ``budget``
    column."""
    budgets = sorted(speed["budget"].unique())
    bases = list(dict.fromkeys(speed["base"]))
    fig, axes = new_figure(len(budgets), (5.4 * len(budgets), 3.8), sharey=True)
    width = 0.8 / len(bases)
    for ax, b in zip(axes[0], budgets):
        part = speed[(speed["budget"] == b) & (speed["strategy"] != speed["base"])]
        names = [d for d in (order or dict.fromkeys(part["strategy"])) if d in set(part["strategy"])]
        x = np.arange(len(names))
        for i, base in enumerate(bases):
            t = part[part["base"] == base].set_index("strategy").reindex(names)
            gain = 100 * (t["ratio"].to_numpy(float) - 1)
            err = np.abs(np.vstack([gain - 100 * (t["low"] - 1), 100 * (t["high"] - 1) - gain]))
            ax.bar(x + (i - (len(bases) - 1) / 2) * width, gain, width, yerr=err, capsize=3,
                   color=BASE_COLORS[i % len(BASE_COLORS)], label=f"over {base}", error_kw={"lw": 0.8})
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(names, fontsize=8, rotation=20, ha="right")
        ax.set_title(f"B = {b}", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("speed gain (%)")
    axes[0, 0].legend(fontsize=8, frameon=False)
    fig.suptitle(f"{title}\nwhiskers: 95% paired prompt-bootstrap intervals", fontsize=10)
    fig.tight_layout()
    return fig


def root_share_figure(budgets: dict, meta: dict | None = None, champion: str | None = None):
    """Each score's share of root selection's gain with its 95% interval, one horizontal bar per score and one panel
    per budget; ``budgets`` as a study's figures hold them (``{"8": {"scores": {score: {"root_share": [point, low,
    high]}}}}``), scores without a share (draft, root) left out; ``champion``'s bar is outlined and its label
    starred."""
    every = [s for f in budgets.values() for s, entry in f["scores"].items() if "root_share" in entry]
    scores, colors = ordered(every), _colors(every)
    y = np.arange(len(scores))
    fig, axes = new_figure(len(budgets), (4.0 * len(budgets), 1.4 + 0.42 * len(scores)), sharex=True,
                           sharey=True)
    panels = []
    for ax, (b, figures) in zip(axes[0], budgets.items()):
        nan = {"root_share": [np.nan] * 3}
        share, low, high = np.array([figures["scores"].get(s, nan).get("root_share", nan["root_share"])
                                     for s in scores], dtype=float).reshape(-1, 3).T
        bar = np.isfinite(share)
        edges = ["black" if s == champion else "none" for s, keep in zip(scores, bar) if keep]
        ax.barh(y[bar], share[bar], 0.7, color=[colors[s] for s, keep in zip(scores, bar) if keep],
                edgecolor=edges, linewidth=1.6)
        ax.set_yticks(y)
        ax.set_yticklabels([f"\u2605 {label(s)}" if s == champion else label(s) for s in scores], fontsize=11)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.axvline(100.0, color="grey", ls=":", lw=1.0)
        ax.set_title(f"B = {b}", fontsize=13)
        ax.set_xlabel("share of root selection's gain (%)", fontsize=11)
        ax.grid(axis="x", alpha=0.3)
        panels.append((ax, share, low, high))
    axes[0, 0].invert_yaxis()  # reading order, top to bottom
    lo, hi = _share_range([v for _, *triple in panels for v in triple])
    axes[0, 0].set_xlim(lo, hi)
    for ax, share, low, high in panels:
        _whiskers(ax, y, share, low, high, lo, hi)
    caption = ("Share of root selection's gain over draft; whiskers: 95% prompt-bootstrap intervals\n(an arrow: the "
               "interval runs past the panel, its end written); dotted: 100%" + ("; \u2605 the champion" if champion
                                                                               else ""))
    fig.suptitle(_caption(meta, caption), fontsize=11)
    fig.tight_layout()
    return fig


SHARE_RANGE = (-100.0, 200.0)  # a share whose root gain is near zero in some resamples spans hundreds of percent


def _share_range(arrays) -> tuple[float, float]:
    """The panels' shared x range: every bar and whisker end with a margin, within ``SHARE_RANGE``."""
    values = np.concatenate([[0.0, 100.0], *arrays])
    values = values[np.isfinite(values)]
    return max(values.min() - 5.0, SHARE_RANGE[0]), min(values.max() + 5.0, SHARE_RANGE[1])


def _whiskers(ax, y, share, low, high, lo: float, hi: float) -> None:
    """The intervals, cut at the panel's edges: a cut end becomes an arrow with the end's value beside it."""
    for row, (s, a, b) in enumerate(zip(share, low, high)):
        if not np.isfinite([s, a, b]).all():
            continue
        left, right = max(a, lo), min(b, hi)
        ax.plot([left, right], [y[row], y[row]], color="black", lw=0.9)
        for end, cut, edge, marker, align in ((a, a < lo, lo, "<", "left"), (b, b > hi, hi, ">", "right")):
            if cut:
                ax.plot([edge], [y[row]], marker=marker, color="black", ms=5)
                ax.annotate(f"{end:.0f}%", (edge, y[row]), xytext=(-4 if align == "right" else 4, 6),
                            textcoords="offset points", ha=align, fontsize=10)  # legible at the UI's preview size
            else:
                ax.plot([end, end], [y[row] - 0.15, y[row] + 0.15], color="black", lw=0.9)
