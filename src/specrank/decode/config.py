"""The decoding configuration, validated once, and the decoding law derived from it once."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from specrank.decode.core import PoolShape
from specrank.law import Law

MAX_TEMPERATURE = 100.0  # far beyond any useful sampling temperature; refuses typos such as 1e9


class ConfigError(ValueError):
    """A decoding parameter is out of range."""


def check_temperature(t, what: str = "temperature") -> float:
    """``t`` if it is a finite number in [0, MAX_TEMPERATURE] (0 = greedy), else a ConfigError naming ``what``."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t <= MAX_TEMPERATURE:
        raise ConfigError(f"{what} must be a finite number in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got {t}")
    return t


@dataclass(frozen=True)
class DecodeConfig:
    """Pool shape, verified tree size, scoring, temperature (0 = greedy), output length and run seed."""

    shape: PoolShape = PoolShape()
    budget: int = 59  # B, verified tree size (root excluded)
    extra: int = 160  # M, top draft-ranked candidates also scored (recording)
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.budget, int) or not 1 <= self.budget <= self.shape.size:
            raise ConfigError(f"budget {self.budget} must be in 1..{self.shape.size} (the pool size)")
        if not isinstance(self.extra, int) or self.extra < 0:
            raise ConfigError(f"extra scored candidates must be an integer >= 0, got {self.extra}")
        check_temperature(self.temperature)
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return Law(self.temperature).greedy

    @property
    def law(self) -> str:
        """``greedy`` (argmax point masses) or ``sampling`` (rows at temperature T)."""
        return Law(self.temperature).name

    @property
    def label_kind(self) -> str:
        """What a reranker for this run predicts: ``argmax`` indicators (greedy) or ``probability``."""
        return Law(self.temperature).label_kind

    @property
    def row_temperature(self) -> float:
        """Temperature of recorded probabilities: T, or 1 under greedy decoding."""
        return self.temperature or 1.0


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Generator seed of one (prompt, run seed): independent of prompt order and resumes."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()[:8], "little") >> 1
