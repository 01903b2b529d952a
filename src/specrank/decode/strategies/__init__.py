"""Selection strategies: what a round verifies (one class per decoder), by name or as objects."""

from specrank.decode.strategies.base import RoundContext, SelectionStrategy, StrategyError
from specrank.decode.strategies.covering import CoveringDecoder
from specrank.decode.strategies.draft import DraftSelection
from specrank.decode.strategies.reranked import RerankedSelection, check_reranker
from specrank.decode.strategies.root import PearlSelection, RootDrawSelection, RootSelection

STRATEGIES = {
    "draft": DraftSelection,
    "root": RootSelection,
    "root-draw": RootDrawSelection,
    "pearl": PearlSelection,
    "covering": CoveringDecoder,
}
RULE_NAMES = tuple(STRATEGIES) + ("reranked",)


def make_strategy(name: str, reranker=None, source: str = "") -> SelectionStrategy:
    """The strategy called ``name``; ``reranked`` needs a loaded reranker."""
    if name == "reranked":
        if reranker is None:
            raise StrategyError("strategy reranked needs a reranker (a fitted estimator, a path or an MLflow URI)")
        return RerankedSelection(reranker, source)
    if reranker is not None:
        raise StrategyError(f"strategy {name!r} takes no reranker (only reranked does)")
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; known: {', '.join(RULE_NAMES)}")
    return STRATEGIES[name]()


__all__ = [
    "RULE_NAMES", "STRATEGIES", "CoveringDecoder", "DraftSelection", "PearlSelection", "RerankedSelection",
    "RootDrawSelection", "RootSelection", "RoundContext", "SelectionStrategy", "StrategyError",
    "check_reranker", "make_strategy",
]
