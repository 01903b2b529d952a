"""The reranker registry: every reranker kind the workflow fits, and every estimator class format 2 reads.

A **kind** is what the workflow, its tables and its command lines name (``isotonic``, ``base``, ``rows``,
``ranking``, ``per_depth``): how to make an unfitted estimator of it, its labels, whether it is a control (a
calibration a reranker must beat) or a reranker, whether Optuna tunes it, and which table it is fitted on (the
first-level features, or the pool's edges). A **class** is an estimator class whose fitted state format 2 stores
through its ``codec`` (``rerankers.state.Codec``); a file is read only as one of ``CLASSES``.

A kind registers once (``register``), with its class when that class is new; nothing else names it. docs/
"Adding a reranker" walks through one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specrank.rerankers.gbm import GBMReranker
from specrank.rerankers.isotonic import IsotonicFirstFactor, PerDepthCalibration
from specrank.rerankers.stacked import StackedReranker

ROLES = ("control", "reranker")
TABLES = ("features", "edges")


@dataclass(frozen=True)
class RerankerKind:
    """``make(seed=, n_jobs=, **gbm)`` -> an unfitted estimator (``gbm``: the workflow's boosting settings, which a
    kind that boosts takes and any other may ignore); ``label``/``full_label``: its names in tables and on the
    results page; ``role``: control or reranker; ``tuned``: Optuna searches ``gbm_space`` for it inside each
    training half; ``table``: what it is fitted on, ``features`` (first-level candidates) or ``edges`` (every pool
    edge, ``featurize --edges-out``)."""

    name: str
    label: str
    full_label: str
    make: Callable
    role: str = "reranker"
    tuned: bool = False
    table: str = "features"

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"reranker kind {self.name}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.table not in TABLES:
            raise ValueError(f"reranker kind {self.name}: table {self.table!r} is not one of {', '.join(TABLES)}")
        if not self.name.isidentifier() or "+" in self.name:
            raise ValueError(f"reranker kind {self.name!r}: a name is an identifier (a column, a model file, a flag)")


def _gbm(features: str, **fixed) -> Callable:
    def make(seed: int = 0, n_jobs: int | None = None, **gbm):
        return GBMReranker(features, n_jobs=n_jobs, random_state=seed, **{**gbm, **fixed})
    return make


KINDS: dict[str, RerankerKind] = {
    "isotonic": RerankerKind("isotonic", "Isotonic", "Isotonic first factor", lambda **_: IsotonicFirstFactor(),
                             role="control"),
    "base": RerankerKind("base", "Base", "Base reranker", _gbm("base"), tuned=True),
    "rows": RerankerKind("rows", "Rows", "Rows reranker", _gbm("rows"), tuned=True),
    "ranking": RerankerKind("ranking", "Ranking", "Ranking reranker", _gbm("rows", objective="lambdarank"),
                            tuned=True),
    "per_depth": RerankerKind("per_depth", "Per-depth", "Per-depth calibration", lambda **_: PerDepthCalibration(),
                              role="control", table="edges"),
}
CLASSES: dict[str, type] = {c.__name__: c for c in (IsotonicFirstFactor, PerDepthCalibration, GBMReranker,
                                                     StackedReranker)}


def register(kind: RerankerKind, cls: type | None = None) -> RerankerKind:
    """Add ``kind`` (and ``cls``, the estimator class it makes, when format 2 does not know it yet: it needs a
    ``codec``); a name taken by another kind or class is refused."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"reranker kind {kind.name!r} is registered already")
    if cls is not None:
        if getattr(cls, "codec", None) is None:
            raise ValueError(f"reranker class {cls.__name__}: no codec (rerankers.state.Codec) for format 2")
        if CLASSES.get(cls.__name__, cls) is not cls:
            raise ValueError(f"reranker class name {cls.__name__!r} is registered already")
        CLASSES[cls.__name__] = cls
    KINDS[kind.name] = kind
    return kind


def kind(name: str) -> RerankerKind:
    """The registered kind ``name`` (an unknown one refused, naming the kinds)."""
    if name not in KINDS:
        raise ValueError(f"unknown reranker {name!r} (choose from {', '.join(KINDS)})")
    return KINDS[name]


def tuned() -> tuple[str, ...]:
    return tuple(n for n, k in KINDS.items() if k.tuned)
