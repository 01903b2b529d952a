"""The online comparison: selection strategies in the decoding loop at the same prompts, realized against expected
acceptance, and their speed (``comparison``: ``compare_online(models, OnlineSettings) -> OnlineComparison``;
``online_tables``, ``online_tracking``; ``specrank online`` in ``online_command``).
"""

from specrank.experiments.online.comparison import OnlineComparison, OnlineSettings, Protocol, compare_online

__all__ = ["OnlineComparison", "OnlineSettings", "Protocol", "compare_online"]
