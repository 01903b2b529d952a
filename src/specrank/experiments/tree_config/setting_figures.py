"""The tree-config figures: acceptance and predicted speed against the tree's size, and the head's reliability."""

from __future__ import annotations

import pandas as pd

from specrank.evaluation.figures import new_figure


def tree_config_figure(table: pd.DataFrame):
    """Acceptance length and predicted tokens/s against num_draft_tokens, one line per topk (at each n the
    topk's best num_steps), 95% prompt-bootstrap intervals as bands."""
    exact = table[table["outside"] == 0]
    exact = exact[exact["tree"] == ""]  # a static tree is one point, not a line over num_draft_tokens
    speed = "tokens_per_s" in exact
    fig, axes = new_figure(2 if speed else 1, (10.5 if speed else 5.4, 3.8))
    panels = [("draft", "acceptance length (tokens / round)")] + ([("tokens_per_s", "predicted tokens/s")] if speed else [])
    key = "tokens_per_s" if speed else "draft_length"
    for ax, (what, ylabel) in zip(axes[0], panels):
        for k, part in exact.groupby("topk"):
            best = part.sort_values(key, ascending=False).drop_duplicates("num_draft_tokens").sort_values(
                "num_draft_tokens")
            col, low, high = (("draft_length", "draft_low", "draft_high") if what == "draft"
                              else ("tokens_per_s", "tokens_per_s_low", "tokens_per_s_high"))
            x = best["num_draft_tokens"].to_numpy()
            line = ax.plot(x, best[col], marker="o", label=f"topk {k}")[0]
            ax.fill_between(x, best[low], best[high], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        ns = sorted(int(n) for n in exact["num_draft_tokens"].unique())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("num_draft_tokens (root included)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].set_title("draft selection; each topk at its best num_steps", fontsize=9)
    fig.tight_layout()
    return fig


def reliability_figure(reliability: pd.DataFrame):
    """The head's draft probability against the target's acceptance of the same edge (diagonal: calibrated)."""
    fig, axes = new_figure(1, (4.2, 4.0))
    ax = axes[0, 0]
    r = reliability[reliability["edges"] > 0]
    ax.plot([0, 1], [0, 1], color="gray", linestyle=":", label="calibrated")
    ax.plot(r["draft_probability"], r["target_acceptance"], marker="o", label="recorded edges")
    for _, row in r.iterrows():
        ax.annotate(f"{int(row['edges'])}", (row["draft_probability"], row["target_acceptance"]), fontsize=6,
                    xytext=(2, -8), textcoords="offset points")
    ax.set_xlabel("draft probability q(x | parent)")
    ax.set_ylabel("target acceptance given the parent")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Reliability of the head (edge counts marked)", fontsize=9)
    fig.tight_layout()
    return fig
