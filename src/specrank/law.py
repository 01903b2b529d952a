"""The decoding law of a run, derived from its temperature here and nowhere else.

Temperature 0 is greedy decoding: the target's rows are point masses on their argmax, so a candidate's first
factor is an ``argmax`` indicator; any other temperature samples, and the first factor is the target's
``probability`` at that temperature. Every layer (decoding, features, rerankers, evaluation) reads these names
from a ``Law``, so the mapping is written once.
"""

from __future__ import annotations

from dataclasses import dataclass

GREEDY, SAMPLING = "greedy", "sampling"  # the law's names
ARGMAX, PROBABILITY = "argmax", "probability"  # the label kinds: what a reranker for that law predicts
LAW_NAMES = (GREEDY, SAMPLING)
LABEL_KINDS = (PROBABILITY, ARGMAX)


@dataclass(frozen=True)
class Law:
    """The law of decoding at ``temperature`` (0: greedy)."""

    temperature: float

    @classmethod
    def of_label_kind(cls, kind: str) -> Law:
        """The law whose rerankers predict ``kind`` labels (a sampling law stands at temperature 1)."""
        if kind not in LABEL_KINDS:
            raise ValueError(f"label kind {kind!r}: expected one of {', '.join(LABEL_KINDS)}")
        return cls(0.0 if kind == ARGMAX else 1.0)

    @classmethod
    def named(cls, name: str) -> Law:
        """The law called ``name`` (a sampling law stands at temperature 1)."""
        if name not in LAW_NAMES:
            raise ValueError(f"law {name!r}: expected one of {', '.join(LAW_NAMES)}")
        return cls(0.0 if name == GREEDY else 1.0)

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
