"""The online comparison: selection strategies in the decoding loop at the same prompts, realized against expected
acceptance, and their speed (``run``, ``tables``, ``tracking``; ``specrank online`` in ``command``).
"""

from specrank.experiments.online.run import OnlineComparison, Protocol, compare_online

__all__ = ["OnlineComparison", "Protocol", "compare_online"]
