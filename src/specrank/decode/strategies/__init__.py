"""Selection strategies: what a round verifies (one class per strategy), by name or as objects."""

import sys

from specrank.decode.strategies.base import RoundContext, SelectionStrategy, StrategyError
from specrank.decode.strategies.covering import CoveringSelection
from specrank.decode.strategies.draft import DraftSelection
from specrank.decode.strategies.reranked import RerankedSelection, check_reranker
from specrank.decode.strategies.root import PearlSelection, RootDrawSelection, RootSelection
from specrank.decode.strategies.static_tree import StaticTreeSelection

STRATEGIES = {
    "draft": DraftSelection,
    "root": RootSelection,
    "root_draw": RootDrawSelection,
    "pearl": PearlSelection,
    "covering": CoveringSelection,
}
STRATEGY_NAMES = tuple(STRATEGIES) + ("reranked",)
# Spellings of one release ago (docs/glossary.md): accepted with a deprecation line, then removed.
DEPRECATED_NAMES = {"root-draw": "root_draw"}


def strategy_name(name: str) -> str:
    """``name`` in the current spelling; a deprecated one is accepted with a line on stderr."""
    if name in DEPRECATED_NAMES:
        new = DEPRECATED_NAMES[name]
        print(f"specrank: strategy {name!r} is deprecated and will be removed in the next release; use {new!r}",
              file=sys.stderr)
        return new
    return name


def make_strategy(name: str, reranker=None, source: str = "") -> SelectionStrategy:
    """The strategy called ``name``; ``reranked`` needs a loaded reranker."""
    name = strategy_name(name)
    if name == "reranked":
        if reranker is None:
            raise StrategyError("strategy reranked needs a reranker (a fitted estimator, a path or an MLflow URI)")
        return RerankedSelection(reranker, source)
    if reranker is not None:
        raise StrategyError(f"strategy {name!r} takes no reranker (only reranked does)")
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}")
    return STRATEGIES[name]()


__all__ = [
    "STRATEGY_NAMES", "STRATEGIES", "CoveringSelection", "DraftSelection", "PearlSelection", "RerankedSelection",
    "RootDrawSelection", "RootSelection", "RoundContext", "SelectionStrategy", "StaticTreeSelection", "StrategyError",
    "DEPRECATED_NAMES", "check_reranker", "make_strategy", "strategy_name",
]
