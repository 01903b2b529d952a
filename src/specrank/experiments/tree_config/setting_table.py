"""The tree-config tables: one row per setting with paired prompt-bootstrap intervals and predicted speed, the
per-position acceptance engines log, the head's reliability, the best settings with the flags to paste, and the
run's summary and metrics."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pandas as pd

from specrank.engines.tree_settings import StaticTreeSetting, TreeConfigError, row_setting
from specrank.experiments.tree_config.setting_scores import SETTING_SCORES, SettingScore
from specrank.selection.pool import PoolBatch
from specrank.selection.stats import PromptBootstrap


def run_interval(prefix: str, interval, variances, level: float) -> dict:
    """Where one engine run's measured value should fall (``{prefix}_low``, ``{prefix}_high``): each side of the
    prompt bootstrap's interval for the expected value (``interval``) widened, in quadrature, by the sampling
    spread of each independent run's accept counts (the per-round ``variances`` summed over the rounds; zero under
    greedy verification, which leaves the bootstrap's interval as it is). The spread of the continuations a sampled
    run follows is not in it. Empty when a variance is missing."""
    if any(v is None for v in variances):
        return {}
    z = NormalDist().inv_cdf(0.5 + level / 2)
    n = len(variances[0])
    spread = z ** 2 * sum(float(np.sum(v)) for v in variances) / max(n, 1) ** 2  # (z * its standard error)^2
    return {f"{prefix}_low": interval.point - np.sqrt((interval.point - interval.low) ** 2 + spread),
            f"{prefix}_high": interval.point + np.sqrt((interval.high - interval.point) ** 2 + spread)}


def prompt_bootstrap(prompt_ids: list, n_boot: int, seed: int, level: float) -> tuple[np.ndarray, PromptBootstrap]:
    """(the sorted prompts of every scored round, one set of paired prompt resamples over them)."""
    prompts = np.unique(np.concatenate(list(prompt_ids) + [np.zeros(0, str)]).astype(str))
    if prompts.size == 0:
        raise TreeConfigError("rounds: no setting holds a recorded round")
    return prompts, PromptBootstrap(prompts, n_resamples=n_boot, seed=seed, level=level)


def setting_table(scores: list[SettingScore], costs: dict | None = None, n_boot: int = 2000, seed: int = 0,
                  level: float = 0.95) -> pd.DataFrame:
    """One row per setting: acceptance length (1 + expected accepted draft tokens per round) of each score with
    paired prompt-bootstrap intervals (one set of prompt resamples for every setting and score), root's and the
    reranker's gain over draft, and predicted tokens/s from ``costs`` ({label: seconds per round}).
    Settings with rounds outside their recorded pool are flagged and not ranked."""
    prompts, boot = prompt_bootstrap([s.prompt_id for s in scores], n_boot, seed, level)
    columns = {}
    for s in scores:
        idx = np.searchsorted(prompts, s.prompt_id.astype(str))
        columns[f"{s.setting.label}|n"] = np.bincount(idx, minlength=len(prompts)).astype(float)
        for name, v in s.accepted.items():
            columns[f"{s.setting.label}|{name}"] = np.bincount(idx, weights=1.0 + v, minlength=len(prompts))
    tot = boot.totals(columns)
    rows = []
    for s in scores:
        st, lab = s.setting, s.setting.label
        row = {"setting": lab, "topk": st.topk, "num_steps": st.num_steps, "num_draft_tokens": st.num_draft_tokens,
               "budget": st.budget, "rounds": s.rounds - s.outside, "outside": s.outside,
               "status": "exact" if s.outside == 0 else f"flagged: {s.outside} of {s.rounds} rounds outside the"
                                                         f" recorded pool ({s.recording}), not scored",
               "recording": s.recording}
        for name in SETTING_SCORES:
            if name not in s.accepted or s.rounds == s.outside:
                row.update({f"{name}_length": np.nan, f"{name}_low": np.nan, f"{name}_high": np.nan})
                continue
            iv = tot.ratio([(f"{lab}|{name}", 1)], [(f"{lab}|n", 1)])
            row.update({f"{name}_length": iv.point, f"{name}_low": iv.low, f"{name}_high": iv.high})
            row.update(run_interval(f"{name}_run", iv, [s.variance.get(name)], level))
            if name != "draft":
                g = tot.ratio([(f"{lab}|{name}", 1), (f"{lab}|draft", -1)], [(f"{lab}|n", 1)])
                row.update({f"{name}_gain": g.point, f"{name}_gain_low": g.low, f"{name}_gain_high": g.high})
                row.update(run_interval(f"{name}_gain_run", g, [s.variance.get(name), s.variance.get("draft")],
                                        level))
        cost = (costs or {}).get(lab)
        if cost is not None:
            row.update({"round_seconds": cost, "tokens_per_s": row["draft_length"] / cost,
                        "tokens_per_s_low": row["draft_low"] / cost, "tokens_per_s_high": row["draft_high"] / cost})
        row.update({"sglang_flags": st.sglang_flags() or "", "eagle_arguments": st.eagle_arguments() or "",
                    "vllm_config": st.vllm_config() or "",
                    "tree": str(st.tree.choices) if isinstance(st, StaticTreeSetting) else ""})
        rows.append(row)
    table = pd.DataFrame(rows)
    key = "tokens_per_s" if "tokens_per_s" in table else "draft_length"
    table["_ok"] = table["outside"] == 0
    table = table.sort_values(["_ok", key], ascending=[False, False], kind="stable").drop(columns="_ok")
    table.insert(0, "rank", np.where(table["outside"] == 0, np.arange(1, len(table) + 1), 0))
    return table.reset_index(drop=True)


def position_table(scores: list[SettingScore]) -> pd.DataFrame:
    """Per-position acceptance rate (the metric engines log): share of rounds accepting >= d draft tokens under
    draft selection, and its ratio to position d - 1 (the conditional rate)."""
    rows = []
    for s in scores:
        if not len(s.positions):
            continue
        rate = s.positions.mean(axis=0)
        prev = np.concatenate([[1.0], rate[:-1]])
        for d, (r, p) in enumerate(zip(rate, prev), start=1):
            rows.append({"setting": s.setting.label, "position": d, "acceptance_rate": r,
                         "conditional_rate": r / p if p > 0 else np.nan})
    return pd.DataFrame(rows, columns=["setting", "position", "acceptance_rate", "conditional_rate"])


def reliability_table(pool: PoolBatch, law: str, bins: int = 10) -> pd.DataFrame:
    """Draft probability (q of each scored edge) against target acceptance of that edge given its parent is
    reached (p under sampling, the argmax indicator under greedy), in equal-width bins of q."""
    scored = ~np.isnan(pool.p_edge)
    q = pool.q_edge[scored].astype(np.float64)
    a = pool.edge_prob(law)[scored]
    which = np.minimum((q * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame({
            "bin_low": np.arange(bins) / bins, "bin_high": np.arange(1, bins + 1) / bins, "edges": count,
            "draft_probability": np.bincount(which, q, bins) / count,
            "target_acceptance": np.bincount(which, a, bins) / count,
        })


def pooled_reliability(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """``reliability_table``s of several recordings pooled bin by bin, each bin's means weighted by its edges."""
    rel = pd.concat(parts, ignore_index=True)
    rel = rel.assign(q_sum=rel["edges"] * rel["draft_probability"].fillna(0.0),
                     a_sum=rel["edges"] * rel["target_acceptance"].fillna(0.0))
    pooled = rel.groupby(["bin_low", "bin_high"], as_index=False)[["edges", "q_sum", "a_sum"]].sum()
    edges = pooled["edges"].where(pooled["edges"] > 0)
    pooled = pooled.assign(draft_probability=pooled["q_sum"] / edges, target_acceptance=pooled["a_sum"] / edges)
    return pooled.drop(columns=["q_sum", "a_sum"])


def best_settings(table: pd.DataFrame) -> dict:
    """The best exact setting overall, the best chain and the best setting vLLM can serve (a chain or a static
    tree; None where the grid has none)."""
    exact = table[table["outside"] == 0]
    if exact.empty:
        raise TreeConfigError("grid: no setting was scored exactly")
    static = exact["tree"] != ""
    chains = exact[(exact["topk"] == 1) & ~static]
    vllm = exact[(exact["topk"] == 1) | static]
    return {"best": exact.iloc[0], "best_chain": None if chains.empty else chains.iloc[0],
            "best_vllm": None if vllm.empty else vllm.iloc[0]}


def serving_flags(row, sglang_head: str, vllm_head: str) -> dict[str, str]:
    """The commands to paste for a table row (heads: paths of the exported heads)."""
    st = row_setting(row)
    out = {}
    if st.sglang_flags():
        out.update({"sglang": st.sglang_flags(sglang_head), "eagle": st.eagle_arguments()})
    if st.vllm_config():
        out["vllm"] = f"--speculative-config '{st.vllm_config(vllm_head)}'"
    return out


def tree_config_summary(table: pd.DataFrame, law: str, recordings: dict, heads: dict[str, str]) -> dict:
    """The best setting overall, the best chain and the best vLLM setting (a chain or a static tree), with the
    flags to paste; ``heads``: the exported heads' paths by engine ({} when the drafter has none)."""
    summary = {"law": law, "recordings": recordings}
    for name, row in best_settings(table).items():
        if row is None:
            continue
        summary[name] = {"setting": row["setting"], "acceptance_length": float(row["draft_length"]),
                         "interval": [float(row["draft_low"]), float(row["draft_high"])],
                         "tokens_per_s": float(row.get("tokens_per_s", float("nan"))),
                         "flags": serving_flags(row, heads.get("sglang", "HEAD"), heads.get("vllm", "HEAD"))}
    if not heads:
        summary["heads"] = "export the head with `specrank drafter export HEAD --format sglang|vllm --out DIR`"
    return summary


def summary_note(summary: dict) -> str:
    """The summary as a few paragraphs of text (an MLflow run's description)."""
    best = summary.get("best", {})
    lines = [f"Tree settings scored exactly on recorded rounds ({summary.get('law')}). Acceptance length = 1 +"
             " expected accepted draft tokens per round; predicted tokens/s = length / (draft + verify + host).",
             f"Best: {best.get('setting')} (length {best.get('acceptance_length', float('nan')):.3f},"
             f" {best.get('tokens_per_s', float('nan')):.1f} tokens/s)."]
    for engine, flags in best.get("flags", {}).items():
        lines.append(f"{engine}: {flags}")
    return "\n\n".join(lines)


def top_metrics(table: pd.DataFrame, n: int = 5) -> dict[str, float]:
    """Settings scored and flagged, and the lengths and speeds of the ``n`` best exact settings (``topI.COLUMN``)."""
    metrics = {"settings": len(table), "flagged": int((table["outside"] > 0).sum())}
    best = table[table["outside"] == 0].head(n)
    for i, (_, r) in enumerate(best.iterrows(), start=1):
        for col in ("draft_length", "draft_low", "draft_high", "root_length", "reranked_length", "plugin_length",
                    "tokens_per_s"):
            if col in r and r[col] == r[col]:
                metrics[f"top{i}.{col}"] = float(r[col])
    return metrics
