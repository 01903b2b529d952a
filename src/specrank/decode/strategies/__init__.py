"""Selection strategies: what a round verifies (one class per strategy), by name or as objects."""

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


def make_strategy(name: str, reranker=None, source: str = "") -> SelectionStrategy:
    """The strategy called ``name``; ``reranked`` needs a loaded reranker."""
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
    "check_reranker", "make_strategy",
]
