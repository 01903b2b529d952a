"""Display names and the reading order of evaluated rules (shared by the report and the figures)."""

from __future__ import annotations

LABELS = {
    "draft": "Draft",
    "isotonic": "Isotonic",
    "per_depth": "Per-depth",
    "base": "Base",
    "rows": "Rows",
    "root": "Root",
    "depth2": "Depth-2",
    "oracle": "Oracle",
    "subst_cache": "Cache row",
    "subst_same_token": "Same-token row",
    "subst_preceding": "Preceding row",
    "mix_cache": "Cache mixture",
    "mix_same_token": "Same-token mixture",
    "mix_preceding": "Preceding mixture",
}
EXACT = ("root", "depth2", "oracle")
CONTROLS = ("isotonic", "per_depth")
ROW_RULES = tuple(k for k in LABELS if k.startswith(("subst_", "mix_")))


def label(rule: str) -> str:
    """Human name of a rule (a reranker column keeps its own name; a stacked rule, ``rows+per_depth``, joins its
    parts' names)."""
    if "+" in rule and rule not in LABELS:
        return " + ".join(label(part) for part in rule.split("+"))
    return LABELS.get(rule, rule)


def ordered(rules) -> list[str]:
    """Draft, controls, rerankers (Base, Rows, then other columns), exact-row rules, retained-row rules."""
    rules = list(dict.fromkeys(rules))
    head = ["draft", *CONTROLS, "base", "rows"]
    extra = [r for r in rules if r not in LABELS]
    return [r for r in head if r in rules] + extra + [r for r in (*EXACT, *ROW_RULES) if r in rules]


def rerankers(rules) -> list[str]:
    """The learned and calibrated first-factor rules among ``rules`` (everything a reranker could be)."""
    return [r for r in ordered(rules) if r not in ("draft", *EXACT, *ROW_RULES)]
