"""The registry of evaluated scores: each one's name, its short label (report, figures, headline table), its full
label (results page), what kind of score it is, and the reading order built from them.

The reranker kinds' names and labels come from their registry (``specrank.rerankers.registry``). The score
functions themselves are ``specrank.selection.scores``; an evaluated score is one of them with its
inputs (a reranker's column, the cross-fitted per-depth factors, a retained row), named as the tables name it.
A reranker column the registry does not know keeps its own name as its label.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from specrank.rerankers.registry import KINDS, ROLES


@dataclass(frozen=True)
class EvaluatedScore:
    """``kind``: draft, control (a calibration a reranker must beat), reranker, stacked (a reranker's first factor
    with per-depth deeper factors), exact (from the recorded target rows) or retained (from a retained row);
    ``built_in``: the evaluation computes it itself, so a predictions column may not take its name."""

    name: str
    label: str
    full_label: str
    kind: str
    built_in: bool


def _registry(*entries: EvaluatedScore) -> MappingProxyType:
    return MappingProxyType({e.name: e for e in entries})


def kind_scores() -> list[EvaluatedScore]:
    """The registered reranker kinds as evaluated scores (``rerankers.registry``): controls, then rerankers, each in
    registration order; a kind fitted on the edges is computed by the evaluation itself (built in)."""
    kinds = sorted(KINDS.values(), key=lambda k: ROLES.index(k.role))
    return [EvaluatedScore(k.name, k.label, k.full_label, k.role, k.table == "edges") for k in kinds]


SCORE_NAMES = _registry(
    EvaluatedScore("draft", "Draft", "Draft selection", "draft", True),
    *kind_scores(),
    EvaluatedScore("rows+per_depth", "Rows + per-depth", "Rows + per-depth", "stacked", False),
    EvaluatedScore("ranking+per_depth", "Ranking + per-depth", "Ranking + per-depth", "stacked", False),
    EvaluatedScore("root", "Root", "Root selection", "exact", True),
    EvaluatedScore("depth2", "Depth-2", "Depth-2 selection", "exact", True),
    EvaluatedScore("oracle", "Oracle", "Oracle", "exact", True),
    EvaluatedScore("subst_cache", "Cache row", "Token-keyed cache row", "retained", True),
    EvaluatedScore("subst_same_token", "Same-token row", "Same-token row", "retained", True),
    EvaluatedScore("subst_preceding", "Preceding row", "Preceding row", "retained", True),
    EvaluatedScore("mix_cache", "Cache mixture", "Cache mixture", "retained", True),
    EvaluatedScore("mix_same_token", "Same-token mixture", "Same-token mixture", "retained", True),
    EvaluatedScore("mix_preceding", "Preceding mixture", "Preceding mixture", "retained", True),
)


def of_kind(*kinds: str) -> tuple[str, ...]:
    """The registered names of ``kinds``, in registry order."""
    return tuple(n for n, s in SCORE_NAMES.items() if s.kind in kinds)


EXACT = of_kind("exact")
CONTROLS = of_kind("control")
RETAINED = of_kind("retained")
BUILT_IN = tuple(n for n, s in SCORE_NAMES.items() if s.built_in)


def label(name: str) -> str:
    """Short label of a score (a reranker column keeps its own name; an unregistered stacked score, ``a+b``, joins
    its parts' labels)."""
    if name in SCORE_NAMES:
        return SCORE_NAMES[name].label
    if name in KINDS:  # a kind registered after this module was imported
        return KINDS[name].label
    if "+" in name:
        return " + ".join(label(part) for part in name.split("+"))
    return name


def full_label(name: str) -> str:
    """Full label of a score, as the results page writes it (a reranker column keeps its own name; an unregistered
    stacked score, ``a+b``, joins its parts' labels)."""
    if name in SCORE_NAMES:
        return SCORE_NAMES[name].full_label
    if name in KINDS:
        return KINDS[name].full_label
    if "+" in name:
        return " + ".join(label(part) for part in name.split("+"))
    return name


def ordered(names) -> list[str]:
    """Draft, controls, rerankers (Base, Rows, then stacked and other columns), exact-row scores, retained-row
    scores."""
    names = list(dict.fromkeys(names))
    head = of_kind("draft", "control", "reranker")
    tail = EXACT + RETAINED
    extra = [n for n in names if n not in head and n not in tail]
    return [n for n in head if n in names] + extra + [n for n in tail if n in names]


def rerankers(names) -> list[str]:
    """The learned and calibrated first-factor scores among ``names`` (everything a reranker could be)."""
    return [n for n in ordered(names) if n not in of_kind("draft", "exact", "retained")]
