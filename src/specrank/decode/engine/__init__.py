"""One round of decoding and the prompt loop: the tree pass (``tree``), a round (``round``), the prompt loop
(``prompt``), the span timer (``timer``) and a prompt's retained target rows (``caches``).

The row caches are public (``RowCaches``, ``TokenRows``): an engine plugin keeps its requests' verify rows as
specrank's decoder keeps them (``specrank.engines.sglang.rescorer``)."""

from specrank.decode.engine.caches import RowCaches, TokenRows

__all__ = ["RowCaches", "TokenRows"]
