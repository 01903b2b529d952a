"""specrank: learned first-token rerankers for tree speculative decoding."""

__version__ = "0.1.0"
