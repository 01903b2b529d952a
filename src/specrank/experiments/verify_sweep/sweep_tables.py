"""The verification-rule sweep (lossy verification, arXiv 2607.26627, Table 3, with exact distortion in place of task
accuracy): one row per (speculation, verification rule), the matched-pair comparison, the report and the trade-off
figure."""

from __future__ import annotations

import itertools

import matplotlib
import numpy as np
import pandas as pd

from specrank.evaluation.figures import new_figure

# Truncation-based rule -> its matched truncation-sampling baseline (lossy verification, arXiv 2607.26627, §5).
MATCHED = {"speccascade": "minp", "typical": "eta"}
DEFAULT_GRID = ("lossless", "minp:p_base=0.2/0.5", "speccascade:p_base=0.2/0.5", "eta:eps=0.02/0.2",
                "typical:eps=0.02/0.2", "lenience:l=0.5/0.8", "cos:lam=0.5")
METRICS = ("block_efficiency", "expected_block_efficiency", "tokens_per_s", "acceptance", "tv", "kl",
           "tv_truncated", "kl_truncated", "ceiling_excess")


class GridError(ValueError):
    """A sweep grid entry is not NAME[:KEY=V1/V2,...]."""


def expand_grid(entry: str) -> list[str]:
    """``NAME:KEY=V1/V2,K2=W`` -> one verification-rule spec per combination of values, in grid order."""
    name, _, body = entry.strip().partition(":")
    if not name:
        raise GridError(f"grid entry {entry!r} has no rule name")
    keys, values = [], []
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not all(v.strip() for v in value.split("/")):
            raise GridError(f"grid parameter {item!r} is not KEY=V1/V2/...")
        keys.append(key.strip())
        values.append([v.strip() for v in value.split("/")])
    return [name + (":" + ",".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True)) if keys else "")
            for combo in itertools.product(*values)]


def summarize_cell(diag: pd.DataFrame) -> dict:
    """Efficiency and mean exact distortion (per emitted token) of one run's diagnostics rows."""
    first = diag[diag["step"] == 0]  # one row per round
    seconds = diag.groupby("prompt_id")["prompt_seconds"].first().sum()
    return {
        "prompts": int(diag["prompt_id"].nunique()),
        "rounds": len(first),
        "tokens": len(diag),
        "block_efficiency": float(first["round_accepted"].mean()),
        "expected_block_efficiency": float(first["expected_accepted"].mean()),
        "tokens_per_s": float(len(diag) / seconds) if seconds > 0 else np.nan,
        "acceptance": float(diag["acceptance"].mean()),
        "tv": float(diag["tv"].mean()),
        "kl": float(diag["kl"].mean()),
        "tv_truncated": float(diag["tv_truncated"].mean()),
        "kl_truncated": float(diag["kl_truncated"].mean()),
        "ceiling_excess": float(diag["ceiling_excess"].max()),
    }


def sweep_table(cells: list[dict], diagnostics: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per cell (``speculation``, ``verification_rule`` spec) with its summary."""
    rows = []
    for cell, diag in zip(cells, diagnostics, strict=True):
        family, _, params = cell["verification_rule"].partition(":")
        rows.append({"speculation": cell["speculation"], "verification_rule": cell["verification_rule"],
                     "family": family, "params": params,
                     **summarize_cell(diag)})
    return pd.DataFrame(rows)


def matched_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Each truncation rule beside its matched baseline at the same parameters and speculation."""
    key = ["speculation", "params"]
    rows = []
    for rule, base in MATCHED.items():
        a, b = table[table["family"] == rule], table[table["family"] == base]
        both = a.merge(b, on=key, suffixes=("", "_baseline"))
        for _, r in both.iterrows():
            rows.append({"speculation": r["speculation"], "verification_rule": r["verification_rule"],
                         "baseline": r["verification_rule_baseline"],
                         "be": r["block_efficiency"], "be_baseline": r["block_efficiency_baseline"],
                         "be_gain": r["block_efficiency"] - r["block_efficiency_baseline"],
                         "expected_be_gain": r["expected_block_efficiency"] - r["expected_block_efficiency_baseline"],
                         "tv_truncated": r["tv_truncated"], "kl_truncated": r["kl_truncated"],
                         "tv_truncated_baseline": r["tv_truncated_baseline"]})
    return pd.DataFrame(rows, columns=["speculation", "verification_rule", "baseline", "be", "be_baseline", "be_gain",
                                       "expected_be_gain", "tv_truncated", "kl_truncated", "tv_truncated_baseline"])


def tree_vs_chain(table: pd.DataFrame) -> pd.DataFrame:
    """Distortion from the truncated target of each truncation rule under both speculations."""
    trunc = table[table["family"].isin(list(MATCHED))]
    tree, chain = trunc[trunc["speculation"] == "tree"], trunc[trunc["speculation"] == "chain"]
    both = tree.merge(chain, on="verification_rule", suffixes=("_tree", "_chain"))
    return both[["verification_rule", "tv_truncated_tree", "tv_truncated_chain", "kl_truncated_tree",
                 "kl_truncated_chain"]]


def findings(table: pd.DataFrame) -> list[str]:
    """The paper's qualitative findings (lossy verification, arXiv 2607.26627), checked on this sweep (one line
    each)."""
    lines = []
    pairs = matched_pairs(table)
    if len(pairs):
        gain = pairs["be_gain"]
        lines.append(f"truncation rules vs matched baselines: block-efficiency gain > 0 in {(gain > 0).sum()} of "
                     f"{len(gain)} cells (mean {gain.mean():+.3f} accepted tokens/round)")
    versus = tree_vs_chain(table)
    if len(versus):
        larger = versus["kl_truncated_tree"] > versus["kl_truncated_chain"]
        lines.append(f"KL from the truncated target larger with tree speculation than with chains in "
                     f"{larger.sum()} of {len(versus)} truncation rules")
    lenience = table[table["family"] == "lenience"]
    if len(lenience):
        lines.append(f"lenience: largest excess of the induced law over its ceiling p/l = "
                     f"{lenience['ceiling_excess'].max():.2e} (<= 0: within the ceiling)")
    return lines


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; floats with 4 significant digits."""
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "|".join("---" for _ in frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def sweep_report(table: pd.DataFrame, meta: dict) -> str:
    """Markdown: the sweep table, the matched pairs, tree vs chain distortion and the findings."""
    shown = ["speculation", "verification_rule", "rounds", "tokens", "block_efficiency", "expected_block_efficiency",
             "tokens_per_s",
             "tv", "kl", "tv_truncated", "kl_truncated", "ceiling_excess"]
    parts = [
        "# Verification-rule sweep",
        "",
        ", ".join(f"{k}: {v}" for k, v in meta.items()),
        "",
        "Block efficiency: mean accepted draft tokens per round (expected: exact E[A] of each tree round). "
        "Distortion: mean over emitted tokens of the exact TV / KL of the emission law from the target row "
        "(`tv`, `kl`) and from the matched truncated target (`*_truncated`).",
        "",
        markdown_table(table[shown]),
        "",
        "## Matched pairs",
        "",
        markdown_table(matched_pairs(table)),
        "",
        "## Truncation rules: tree vs chain",
        "",
        markdown_table(tree_vs_chain(table)),
        "",
        "## Findings",
        "",
        *[f"- {line}" for line in findings(table)],
        "",
    ]
    return "\n".join(parts)


def tradeoff_figure(table: pd.DataFrame, meta: dict | None = None):
    """Block efficiency vs exact distortion, one curve per rule family and speculation (tree solid, chain dashed);
    left: TV from the target row, right: TV from the matched truncated target."""
    fig, axes = new_figure(2, (11.5, 4.4))
    axes = axes[0]
    families = list(dict.fromkeys(table["family"]))
    colors = {f: matplotlib.colormaps["tab10"](i % 10) for i, f in enumerate(families)}
    for ax, metric in zip(axes, ("tv", "tv_truncated"), strict=True):
        for (family, speculation), group in table.groupby(["family", "speculation"], sort=False):
            group = group.dropna(subset=[metric]).sort_values(metric)
            if group.empty:
                continue
            ax.plot(group[metric], group["block_efficiency"], marker="o" if family != "lossless" else "*", ms=6,
                    ls="-" if speculation == "tree" else "--", color=colors[family], label=f"{family} ({speculation})")
        ax.set_xlabel("mean TV from the target" if metric == "tv" else "mean TV from the matched truncated target")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    axes[0].set_ylabel("block efficiency (accepted draft tokens / round)")
    caption = "Block efficiency vs exact distortion; solid: tree speculation, dashed: chain speculation"
    if meta:
        caption += "\n" + ", ".join(f"{k}={v}" for k, v in meta.items())
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    return fig
