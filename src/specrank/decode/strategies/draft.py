"""Draft selection (EAGLE-3's tree)."""

from __future__ import annotations

from specrank.decode.strategies.base import SelectionStrategy


class DraftSelection(SelectionStrategy):
    """Draft selection: top-B by cumulative draft probability."""
