"""The covering strategy (target-row reuse, arXiv 2610.29210, App. D.10)."""

from __future__ import annotations

from specrank.decode.strategies.base import SelectionStrategy
from specrank.decode.strategies.draft import DraftSelection
from specrank.decode.strategies.root import RootDrawSelection


class CoveringSelection(SelectionStrategy):
    """Draft selection, except that a draw labelling a leaf is emitted as the continuation and the leaf's
    row seeds the next round, which selects by root-draw selection."""

    name = "covering"
    carries_leaf_row = True

    def __init__(self):
        self.draft, self.root_draw = DraftSelection(), RootDrawSelection()

    def plan(self, root_known):
        return self.root_draw if root_known else self.draft
