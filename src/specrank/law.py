"""The decoding law of a run, derived from its temperature here and nowhere else.

Temperature 0 is greedy decoding: the target's rows are point masses on their argmax, so a candidate's first
factor is an ``argmax`` indicator; any other temperature samples, and the first factor is the target's
``probability`` at that temperature, read from the recorded ``p_edge`` column (``p_argmax_child`` for greedy
runs). Every layer (decoding, features, rerankers, selection, evaluation) reads these from a ``Law``, so each
mapping is written once; code elsewhere compares no law name or label kind.
"""

from __future__ import annotations

from dataclasses import dataclass

GREEDY, SAMPLING = "greedy", "sampling"  # the law's names
ARGMAX, PROBABILITY = "argmax", "probability"  # the label kinds: what a reranker for that law predicts
LAW_NAMES = (GREEDY, SAMPLING)
LABEL_KINDS = (PROBABILITY, ARGMAX)
LABEL_COLUMNS = {GREEDY: "p_argmax_child", SAMPLING: "p_edge"}  # the recorded column a first factor's label is


class LawError(ValueError):
    """A law name or label kind that is neither."""


@dataclass(frozen=True)
class Law:
    """The law of decoding at ``temperature`` (0: greedy)."""

    temperature: float

    @classmethod
    def of_label_kind(cls, kind: str) -> Law:
        """The law whose rerankers predict ``kind`` labels (a sampling law stands at temperature 1)."""
        if kind not in LABEL_KINDS:
            raise LawError(f"label kind {kind!r}: expected one of {', '.join(LABEL_KINDS)}")
        return cls(0.0 if kind == ARGMAX else 1.0)

    @classmethod
    def named(cls, name: str) -> Law:
        """The law called ``name`` (a sampling law stands at temperature 1)."""
        if name not in LAW_NAMES:
            raise LawError(f"law {name!r}: expected one of {', '.join(LAW_NAMES)}")
        return cls(0.0 if name == GREEDY else 1.0)

    @classmethod
    def of(cls, law: Law | str) -> Law:
        """``law`` itself, or the law it names."""
        return law if isinstance(law, Law) else cls.named(law)

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    @property
    def name(self) -> str:
        """``greedy`` (argmax point masses) or ``sampling`` (rows at temperature T)."""
        return GREEDY if self.greedy else SAMPLING

    @property
    def label_kind(self) -> str:
        """What a reranker for this law predicts: ``argmax`` indicators (greedy) or ``probability``."""
        return ARGMAX if self.greedy else PROBABILITY

    @property
    def label_column(self) -> str:
        """The recorded column holding a candidate edge's target probability under this law: ``p_edge``, or the
        point mass ``p_argmax_child`` (1 on the target's argmax child) for greedy runs."""
        return LABEL_COLUMNS[self.name]

    @property
    def binary_labels(self) -> bool:
        """Whether the labels are 0/1 indicators (greedy: a classifier's task) rather than probabilities."""
        return self.greedy

    @property
    def folder(self) -> str:
        """A run's folder name at this law: ``greedy``, or ``t<T>`` for sampling (``t1``, ``t0.7``)."""
        return GREEDY if self.greedy else f"t{float(self.temperature):g}"
