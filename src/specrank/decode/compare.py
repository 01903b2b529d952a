"""Rules compared inside the online loop (``--compare``) and the measurement of online runs.

For measurement only, a tree pass may also score the union of other rules' trees at the
decoder's own context: the verifier never sees these prefixes, and the tree mask keeps the
verified tree's rows unchanged. The recorded target probabilities then give, per round,
the expected acceptance of every compared rule with the offline value functions of
``specrank.selection`` (the same code the offline evaluation runs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specrank.selection import DraftGroups, PoolBatch, PromptBootstrap, draw_values, fixed_values, rule_score
from specrank.selection.select import select_top

COMPARABLE = ("draft", "root", "root-draw", "pearl", "reranked")
VALUE_NAME = {"root-draw": "root_draw"}  # online rule name -> selection value name


class CompareError(ValueError):
    """A ``--compare`` list names a rule that cannot be measured."""


def parse_rules(text: str | None, allowed=COMPARABLE) -> list[str]:
    """``"root,draft"`` -> ["root", "draft"]; one-line error for an unknown or repeated name."""
    if not text:
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise CompareError(f"cannot compare rule {bad[0]!r}; choose from {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise CompareError(f"rule list {text!r} repeats a rule")
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


def acceptance_summary(rounds: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per decoder: realized mean acceptance and each ``expected_<rule>`` mean, prompt-bootstrap intervals,
    and realized minus the decoder's own expected value on the same rounds.

    ``rounds``: one row per round with ``decoder``, ``prompt_id``, ``realized`` and ``expected_*`` columns.
    """
    rows = []
    for decoder, part in rounds.groupby("decoder", sort=False):
        boot = PromptBootstrap(part["prompt_id"].to_numpy(), n_boot, seed)
        cols = {c: part[c].to_numpy(float) for c in part.columns if c == "realized" or c.startswith("expected_")}
        usable = {k: v for k, v in cols.items() if not np.isnan(v).any()}
        tot = boot.totals(usable)
        for col in usable:
            iv = tot.mean(col)
            rows.append({"decoder": decoder, "statistic": col, "mean": iv.point, "low": iv.low, "high": iv.high,
                         "rounds": len(part)})
        own = f"expected_{decoder}"
        if own in usable:
            iv = tot.gain("realized", own)
            rows.append({"decoder": decoder, "statistic": "realized_minus_expected", "mean": iv.point,
                         "low": iv.low, "high": iv.high, "rounds": len(part)})
    return pd.DataFrame(rows)


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
