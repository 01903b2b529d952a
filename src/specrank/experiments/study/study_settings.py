"""What a study records and fits (``StudySettings``), its defaults, and the settings its offline figures
depend on."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specrank.decode.config import check_temperature
from specrank.rerankers import GBMReranker

FIRST_CHUNK = 24  # prompts of the first decoding call, whose rounds per prompt size the next calls
CHUNK = 120  # the most prompts one decoding call adds
SHARD_SIZE = 4


# Sized for a 2-core machine: 10,000 rounds at T = 1 and 4,000 greedy with the shipped head on Spec-Bench fit in
# a 150-minute run on 2 Ray workers of one thread each (the default run's own time: docs/results/study.json,
# timing).
DEFAULT_ROUNDS = 10_000
DEFAULT_GREEDY_ROUNDS = 4_000
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_ONLINE_PROMPTS = 100  # unseen prompts of the online goal cell (first sampled temperature, B = 8)
DEFAULT_ONLINE_OTHER_PROMPTS = 40  # of the other cells (other temperatures, B = 59)
ONLINE_BUDGETS = (8, 59)
EXPERIMENT = "specrank-study"


class StudyDirError(ValueError):
    """The study directory holds another study."""


@dataclass(frozen=True)
class StudySettings:
    """What a study records and fits: ``rounds`` at each sampling temperature of ``temperatures`` and
    ``greedy_rounds`` greedily (None: every prompt, in one decoding call), ``max_new_tokens`` a prompt, decoding
    calls of at most ``chunk`` prompts, from the first ``limit`` prompts of ``prompts`` (a JSONL file; None: the
    bundled Spec-Bench questions), all of them when ``limit`` is None;
    ``bootstrap`` resamples, ``tune_trials`` Optuna trials per fold of Base and Rows (0: untuned, with
    ``n_estimators`` boosting iterations; None: the rerankers' default), ``seed`` for the prompt order, decoding
    and bootstrap; with ``online``, ``online_prompts`` never recorded decode in the loop at ``online_budgets``
    (``online_other_prompts`` of them outside the first sampled temperature's B = 8). Written whole into
    ``results.json``."""

    temperatures: tuple[float, ...] = (1.0, 0.0)
    rounds: int | None = DEFAULT_ROUNDS
    greedy_rounds: int | None = DEFAULT_GREEDY_ROUNDS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    chunk: int = CHUNK
    bootstrap: int = 2000
    tune_trials: int = 4
    n_estimators: int | None = None
    seed: int = 0
    online: bool = True
    online_prompts: int = DEFAULT_ONLINE_PROMPTS
    online_other_prompts: int = DEFAULT_ONLINE_OTHER_PROMPTS
    online_budgets: tuple[int, ...] = ONLINE_BUDGETS
    limit: int | None = None
    prompts: str | None = None  # a JSONL file of prompts (None: the bundled Spec-Bench questions)

    def __post_init__(self):
        for name in ("rounds", "greedy_rounds", "max_new_tokens", "chunk", "bootstrap", "online_prompts",
                     "online_other_prompts", "limit"):
            value = getattr(self, name)
            if value is None and name in ("rounds", "greedy_rounds", "limit"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"study setting {name} must be an integer >= 1, got {value!r}")
        if not set(self.online_budgets) <= set(ONLINE_BUDGETS):
            raise ValueError(f"online budgets must be among {ONLINE_BUDGETS}, got {self.online_budgets}")
        for t in self.temperatures:
            check_temperature(t)

    @property
    def trees(self) -> int:
        """Base and Rows' boosting iterations when untuned (``n_estimators``, else the rerankers' default)."""
        return self.n_estimators or GBMReranker().n_estimators

    def written(self, reserved: int) -> dict:
        """The settings as ``results.json`` keeps them: every field, the online ones as the study ran them
        (``reserved`` prompts kept unseen), and the round targets by law."""
        fields = {k: v for k, v in asdict(self).items() if k != "prompts"}  # results.json names the file apart
        return {**fields, "temperatures": list(self.temperatures), "online_prompts": reserved,
                "online_other_prompts": min(self.online_other_prompts, reserved),
                "online_budgets": list(self.online_budgets) if reserved else [],
                "n_estimators": self.trees,
                "rounds_target": {"sampled": self.rounds, "greedy": self.greedy_rounds}}


def offline_settings(settings: StudySettings) -> dict:
    """The settings a temperature's offline figures depend on (every one but the online phase's; the prompts are
    the study's own ``prompts.jsonl``, checked apart)."""
    return {k: v for k, v in asdict(settings).items()
            if not k.startswith("online") and k not in ("temperatures", "prompts")}
