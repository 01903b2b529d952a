"""Rules compared inside the online loop (``--compare``) and the measurement of online runs.

For measurement only, a tree pass may also score the union of other rules' trees at the
decoder's own context: the verifier never sees these prefixes, and the tree mask keeps the
verified tree's rows unchanged. The recorded target probabilities then give, per round,
the expected acceptance of every compared rule with the offline value functions of
``specrank.selection`` (the same code the offline evaluation runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specrank.selection import DraftGroups, PoolBatch, PromptBootstrap, cumulate, draw_values, fixed_values, rule_score
from specrank.selection.select import select_top

COMPARABLE = ("draft", "root", "root-draw", "pearl", "reranked")
VALUE_NAME = {"root-draw": "root_draw"}  # online rule name -> selection value name


@dataclass
class Measure:
    """Measurement-only scoring in a tree pass: ``rules`` compared at the decoder's contexts; ``record``
    also scores the expanded nodes and top-M candidates so the rounds hold every pool edge (the recorder)."""

    rules: tuple = ()
    record: bool = False
    reranker: object = None  # a RerankedSelection, for comparing "reranked"


class CompareError(ValueError):
    """A ``--compare`` list names a rule that cannot be measured."""


def parse_rules(text: str | None, allowed=COMPARABLE, what: str = "--compare") -> list[str]:
    """``"root,draft"`` -> ["root", "draft"]; one-line error naming ``what`` for an unknown or repeated name."""
    if not text:
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise CompareError(f"{what}: unknown rule {bad[0]!r}; choose from {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise CompareError(f"{what}: {text!r} repeats a rule")
    return names


def branch_union(batch: PoolBatch, budget: int) -> np.ndarray:
    """(M,) bool: every first-level candidate and its ``budget - 1`` best draft-ranked descendants.

    Holds every rule's tree that replaces only first factors (root, reranked, draft) and
    root-draw's tree for every draw, so their values need nothing outside it.
    """
    within = DraftGroups.of(batch).within[0]
    return (batch.depth[0] == 1) | ((within >= 0) & (within < budget - 1))


def measured_nodes(batch: PoolBatch, rules, budget: int, law: str, root_known: bool, first_factor=None) -> np.ndarray:
    """(M,) bool, ancestor-closed: prefixes to score so that every rule in ``rules`` has a value."""
    depth = batch.depth
    nodes = np.zeros(batch.shape[1], bool)
    for rule in rules:
        if rule in ("draft", "pearl"):
            nodes |= select_top(batch.draft_logp, depth, budget)[0]
        elif rule == "reranked":
            nodes |= select_top(rule_score(batch, "reranked", law, first_factor=first_factor), depth, budget)[0]
        elif rule == "root" and root_known:
            nodes |= select_top(rule_score(batch, "root", law), depth, budget)[0]
        else:  # root before the root row is known, root-draw for every draw
            nodes |= branch_union(batch, budget)
    return nodes


def expected_values(batch: PoolBatch, rules, budget: int, law: str, first_factor=None) -> dict[str, float]:
    """{rule: expected acceptance of its tree} on one scored round (root-draw, PEARL count the draw)."""
    out = {}
    draws = None
    for rule in rules:
        if rule in ("root-draw", "pearl"):
            draws = draws or draw_values(batch, [budget], law)
            out[rule] = float(draws[VALUE_NAME.get(rule, rule)][0][0, 0])
            continue
        inputs = {"first_factor": first_factor} if rule == "reranked" else {}
        out[rule] = float(fixed_values(batch, rule_score(batch, rule, law, **inputs), [budget], law)[0][0, 0])
    return out


def own_expected(record: dict, tree: np.ndarray, rule, node: int, law: str) -> float:
    """Expected acceptance of the selected tree given the round's draw (its mean is the rule's value)."""
    edge = record["p_argmax_child"] if law == "greedy" else record["p_edge"]
    path = cumulate(record["parent"][None], record["depth"][None], np.asarray(edge, np.float64)[None])[0]
    if not rule.draws_first:
        return float(path[tree].sum())
    if node < 0:
        return float(rule.counts_draw)
    branch = record_batch(record).first_ancestor[0] == node
    return float(path[tree & branch].sum() / path[node]) if path[node] > 0 else float(rule.counts_draw)


_POOL = ("token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child")


def record_batch(record: dict) -> PoolBatch:
    """A one-round PoolBatch of a round record (target probabilities as scored by its passes)."""
    return PoolBatch(**{k: np.asarray(record[k])[None] for k in _POOL})


def acceptance_summary(rounds: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per decoder: mean ``realized``, ``expected`` (its own tree's value given the round's draw) and each
    ``expected_<rule>`` with prompt-bootstrap intervals, and realized minus expected on the same rounds.

    ``rounds``: one row per round with ``decoder``, ``prompt_id``, ``realized`` and ``expected*`` columns.
    """
    rows = []
    for decoder, part in rounds.groupby("decoder", sort=False):
        boot = PromptBootstrap(part["prompt_id"].to_numpy(), n_boot, seed)
        cols = {c: part[c].to_numpy(float) for c in part.columns if c == "realized" or c.startswith("expected")}
        usable = {k: v for k, v in cols.items() if not np.isnan(v).any()}
        tot = boot.totals(usable)
        stats = {col: tot.mean(col) for col in usable}
        if "expected" in usable:
            stats["realized_minus_expected"] = tot.gain("realized", "expected")
        for name, iv in stats.items():
            rows.append({"decoder": decoder, "statistic": name, "mean": iv.point, "low": iv.low, "high": iv.high,
                         "rounds": len(part), "prompts": len(boot.prompts)})
    return pd.DataFrame(rows)


def decoder_table(decodes: pd.DataFrame) -> pd.DataFrame:
    """Per decoder: tokens, target passes, tokens per pass, tokens/s and the summed wall-time split."""
    seconds = [c for c in decodes.columns if c.endswith("_s")]
    t = decodes.groupby("decoder", sort=False)[["tokens", "rounds", "passes", "seconds"] + seconds].sum()
    t["tokens_per_pass"] = t["tokens"] / t["passes"]
    t["tokens_per_s"] = t["tokens"] / t["seconds"]
    for c in seconds:
        t[c.replace("_s", "_share")] = t[c] / t["seconds"]
    return t.reset_index()


def acceptance_figure(summary: pd.DataFrame):
    """Bar chart: realized mean acceptance by decoder with intervals, own expected value as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    realized = summary[summary["statistic"] == "realized"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(1.2 * len(realized) + 2, 3.2))
    x = np.arange(len(realized))
    err = np.vstack([realized["mean"] - realized["low"], realized["high"] - realized["mean"]])
    ax.bar(x, realized["mean"], yerr=err, capsize=4, color="tab:blue", label="realized")
    expected = summary[summary["statistic"] == "expected"].set_index("decoder")["mean"]
    ax.scatter(x, [expected.get(d, np.nan) for d in realized["decoder"]], color="black", marker="_", s=400,
               zorder=3, label="expected (same rounds)")
    ax.set_xticks(x, realized["decoder"])
    ax.set_ylabel("accepted draft tokens / round")
    ax.set_title("Realized acceptance by rule (95% prompt-bootstrap intervals)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speed_ratios(decodes: pd.DataFrame, base: str, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> pd.DataFrame:
    """Speed of each decoder over ``base`` (summed tokens / summed seconds), paired prompt bootstrap.

    ``decodes``: one row per (prompt, decoder) with ``prompt_id``, ``decoder``, ``tokens``, ``seconds``.
    """
    tokens = decodes.pivot(index="prompt_id", columns="decoder", values="tokens")
    seconds = decodes.pivot(index="prompt_id", columns="decoder", values="seconds")
    if base not in tokens.columns:
        raise CompareError(f"speed base {base!r} was not run")
    if tokens.isna().any().any():
        raise CompareError("speed ratios need every decoder on every prompt")
    w = PromptBootstrap(tokens.index.to_numpy(), n_boot, seed, level).weights  # (R, P), prompts sorted
    tail = 100 * (1 - level) / 2
    speed = lambda wt, d: (wt @ tokens[d].to_numpy(float)) / (wt @ seconds[d].to_numpy(float))  # noqa: E731
    ones = np.ones(len(tokens))
    rows = []
    for d in tokens.columns:
        ratio = speed(w, d) / speed(w, base)
        low, high = np.percentile(ratio, [tail, 100 - tail])
        rows.append({"decoder": d, "base": base, "tokens_per_s": float(speed(ones, d)),
                     "ratio": float(speed(ones, d) / speed(ones, base)), "low": float(low), "high": float(high)})
    return pd.DataFrame(rows)


def realized_gain(rounds: pd.DataFrame, decoder: str, base: str, n_boot: int = 2000, seed: int = 0):
    """Mean realized acceptance of ``decoder`` minus ``base`` at their own contexts; prompts resampled
    jointly for both (App. D.3). Returns an ``Interval``."""
    from specrank.selection.stats import _interval

    parts = {d: rounds[rounds["decoder"] == d] for d in (decoder, base)}
    if any(p.empty for p in parts.values()):
        raise CompareError(f"realized gain needs rounds of both {decoder!r} and {base!r}")
    boot = PromptBootstrap(rounds["prompt_id"].to_numpy(), n_boot, seed)
    means = []
    for part in parts.values():
        idx = np.searchsorted(boot.prompts, part["prompt_id"].to_numpy())
        sums = np.bincount(idx, weights=part["realized"].to_numpy(float), minlength=len(boot.prompts))
        counts = np.bincount(idx, minlength=len(boot.prompts)).astype(float)
        means.append(((sums.sum() / counts.sum()), (boot.weights @ sums) / (boot.weights @ counts)))
    point = means[0][0] - means[1][0]
    return _interval(point, means[0][1] - means[1][1], boot.level)
