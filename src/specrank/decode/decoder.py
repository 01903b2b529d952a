"""The public decoder: a target, a drafter and a selection strategy, generating text losslessly.

    from specrank.decode import load_target, load_drafter, Decoder
    target = load_target("smollm2"); drafter = load_drafter("early-exit:8", target)
    dec = Decoder(target, drafter, strategy="reranked", reranker="runs/greedy/rerankers/models/rows-fold0", budget=8)
    out = dec.generate("Write a haiku about rain.", max_new_tokens=32, temperature=0)
    out.text, out.tokens, out.stats

Every strategy verifies by exhaustive target sampling, so the output law is the target's own:
greedy output equals the target's greedy decoding, sampled output is distributed as the target's.
``Decoder(..., pipeline=True)`` drafts in a worker process while the target runs the root pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.engine.prompt import decode_prompt, iter_rounds
from specrank.decode.engine.round import decode_round
from specrank.decode.engine.timer import Timer
from specrank.decode.pipeline import PipelinedDrafter
from specrank.decode.prompts import PromptError, check_context, encode_prompt
from specrank.decode.runs.measure import Measure
from specrank.decode.strategies import SelectionStrategy, StrategyError, make_strategy
from specrank.decode.verify import ExhaustiveVerifier
from specrank.files import names_a_uri
from specrank.law import Law
from specrank.rerankers import load_reranker
from specrank.rerankers.defaults import (CHAMPIONS, champion_for, champion_name, default_reranker_dir,
                                         load_default_reranker)


@dataclass
class GenerationStats:
    """How one generation went: rounds, accepted draft tokens per round, target passes and the time split."""

    rounds: int
    accepted: list[int]  # accepted draft tokens, round by round
    passes: int  # target passes after the prefill (root passes included)
    tokens: int  # tokens emitted
    seconds: float
    time_split: dict[str, float] = field(default_factory=dict)  # prefill, draft, root, target, rerank, bookkeeping

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else float("nan")

    @property
    def root_pass_hidden_share(self) -> float:
        """Share of root-pass time spent while the drafter drafted (pipelined decoding; 0 when serial)."""
        root = self.time_split.get("root", 0.0)
        return self.time_split.get("root_pass_hidden", 0.0) / root if root > 0 else float("nan")


@dataclass
class GenerationOutput:
    """The generated token ids (EOS included when emitted), their text and the generation's statistics."""

    tokens: list[int]
    text: str
    stats: GenerationStats
    prompt_tokens: list[int]


class AcceptedCounter:
    """The lightest round observer: accepted draft tokens per round; nothing extra scored or recorded."""

    wants_rows = False

    def __init__(self):
        self.accepted: list[int] = []

    def scored_nodes(self, *_):
        return np.zeros(0, np.int64), False

    def observe(self, view) -> None:
        self.accepted.append(len(view.accepted))


class Decoder:
    """Tree speculative decoding of ``target`` with ``drafter``, selecting each round's tree by ``strategy``.

    ``strategy``: a name (``draft``, ``root``, ``root_draw``, ``pearl``, ``reranked``, ``covering``) or a
    ``SelectionStrategy``; ``reranked`` takes ``reranker``: a fitted estimator or a saved reranker's path
    (format 2, read as data); an MLflow model URI is resolved above decoding, by
    ``specrank.tracking.resolve_reranker``. With the shipped head (``eagle3:default``) and no reranker, ``reranked``
    uses ``reranker:default``: the default study's champion that fits the temperature each ``generate`` decodes at.
    ``config`` (a ``DecodeConfig``) holds the verified tree size B (``budget``, root excluded), the pool's growth
    (``shape``) and the temperature, the default of ``generate`` (0 = greedy); the keywords ``budget``, ``shape`` and
    ``temperature`` are sugar folded into it once. Without a temperature (neither in ``config`` nor as a keyword),
    the decoder serves any: greedy unless ``generate`` says otherwise. A reranker is checked against the temperature
    it decodes at: here when one is known, else when ``generate`` or ``rounds`` starts, before any model pass. The
    champions ``reranker:NAME`` are loaded here, for each law the decoder serves; ``generate`` changes nothing on
    the decoder.

    ``pipeline=True`` moves the drafter into its own worker process (on ``drafter_device``, default its own device, with
    ``drafter_threads`` torch threads), where it drafts while the target runs the root pass (target-row reuse, arXiv
    2610.29210, App. D.14); ``close()`` or a ``with`` block stops the worker. Drafters that read the target's hidden
    states (EAGLE-3 heads) are refused (``PipelineError``).
    """

    def __init__(self, target, drafter, strategy="draft", *, reranker=None, config: DecodeConfig | None = None,
                 budget: int | None = None, shape: PoolShape | None = None, temperature: float | None = None,
                 verifier=None, pipeline: bool = False, drafter_device=None, drafter_threads: int | None = None):
        self.target, self.drafter, self.verifier = target, drafter, verifier
        given = {k: v for k, v in (("budget", budget), ("shape", shape), ("temperature", temperature)) if v is not None}
        self.config = replace(config or DecodeConfig(extra=0), **given)  # the keywords folded in, once
        # None: the decoder serves any temperature (greedy unless ``generate`` says otherwise)
        self.temperature = self.config.temperature if config is not None or temperature is not None else None
        self.champion = named_champion(strategy, reranker, drafter)  # reranker:NAME's NAME, or None
        if self.champion is None:
            self.strategies = {None: resolve_strategy(strategy, reranker)}
            self.strategies[None].check(self.config, law=self.temperature is not None)
        else:  # the champion of each law the decoder serves, resolved now
            laws = [self.config.temperature] if self.temperature is not None else [0.0, 1.0]
            self.strategies = {Law(t).name: self._champion(t) for t in laws}
        if pipeline:
            self.drafter = PipelinedDrafter(drafter, drafter_device, drafter_threads)
        elif drafter_device is not None or drafter_threads is not None:
            raise ValueError("drafter_device and drafter_threads place the worker of pipeline=True")

    def close(self) -> None:
        """Stop a pipelined decoder's drafter worker (nothing to do otherwise)."""
        if hasattr(self.drafter, "close"):
            self.drafter.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def strategy(self) -> SelectionStrategy:
        """The strategy at the decoder's own temperature (greedy when it has none)."""
        return self.strategy_for(self.config)

    def strategy_for(self, config: DecodeConfig) -> SelectionStrategy:
        """The strategy that decodes under ``config``: the decoder's one, or the champion of its law."""
        if self.champion is None:
            return self.strategies[None]
        if config.law not in self.strategies:
            raise StrategyError(f"this decoder was built for T = {self.config.temperature:g} (reranker:{self.champion}"
                                f", {self.config.law}); build one without a temperature to decode at both laws")
        return self.strategies[config.law]

    def _config(self, max_new_tokens: int, temperature: float | None, seed: int) -> DecodeConfig:
        """The decoding's configuration at ``temperature`` (None: the decoder's), its strategy checked against it."""
        t = next((x for x in (temperature, self.temperature) if x is not None), 0.0)
        config = replace(self.config, temperature=t, max_new_tokens=max_new_tokens, seed=seed)
        self.strategy_for(config).check(config)
        return config

    def _champion(self, temperature: float) -> SelectionStrategy:
        """``reranked`` with the named champion that fits ``temperature``."""
        path = default_reranker_dir(temperature, self.champion)
        return make_strategy("reranked", load_default_reranker(temperature, self.champion), str(path))

    def _encode(self, prompt, config: DecodeConfig, prompt_id: str) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError(f"prompt {prompt_id!r} is empty")
            ids = encode_prompt(self.target.tokenizer, prompt)
        else:
            ids = [int(t) for t in prompt]
        if len(ids) < 2:
            raise PromptError(f"a prompt of token ids needs at least 2 ids, got {len(ids)}")
        check_context(ids, prompt_id, getattr(self.target, "context_length", None), config.max_new_tokens,
                      config.shape.depth)
        return ids

    def generate(self, prompt, *, max_new_tokens: int = 256, temperature: float | None = None, seed: int = 0,
                 prompt_id: str | None = None):
        """Generate from ``prompt``: a string (one user turn under the chat template), a list of token ids, or
        a list of either (then a list of outputs, prompt ``i`` seeded as prompt id ``str(i)``)."""
        if is_batch(prompt):
            return [self.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                  prompt_id=str(i)) for i, p in enumerate(prompt)]
        config = self._config(max_new_tokens, temperature, seed)
        ids = self._encode(prompt, config, prompt_id or "0")
        timer, counter = Timer(), AcceptedCounter()
        tokens, _ = decode_prompt(self.target, self.drafter, ids, config, self.strategy_for(config), verifier=self.verifier,
                                  observer=counter, prompt_id=prompt_id or "0", timer=timer)
        stats = GenerationStats(timer.rounds, counter.accepted, timer.passes, len(tokens), timer.decoding,
                                timer.split())
        return GenerationOutput(tokens, self.decode_text(tokens), stats, ids)

    def rounds(self, prompt, *, max_new_tokens: int = 256, temperature: float | None = None, seed: int = 0,
               prompt_id: str = "0"):
        """Yield each round's record (pool, target probabilities where scored, acceptance) as it is decoded."""
        config = self._config(max_new_tokens, temperature, seed)
        ids = self._encode(prompt, config, prompt_id)
        verifier = self.verifier or ExhaustiveVerifier(config.temperature)
        timer, measure, strategy = Timer(), Measure(), self.strategy_for(config)

        def round_fn(state):
            return decode_round(self.target, self.drafter, state, config, verifier, strategy, timer, measure)

        yield from iter_rounds(self.target, self.drafter, ids, config, round_fn, prompt_id=prompt_id, timer=timer,
                               with_rows=strategy.needs_rows)

    def decode_text(self, tokens) -> str:
        """The text of generated token ids (special tokens left out)."""
        tokenizer = self.target.tokenizer
        return tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else ""


def is_batch(prompt) -> bool:
    """A list of prompts (strings or token-id lists), as opposed to one prompt."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], (str, list, tuple))


def named_champion(strategy, reranker, drafter) -> str | None:
    """``NAME`` when ``reranked`` takes the champions ``reranker:NAME``: named, or no reranker given with a named head
    (``eagle3:default``, ``eagle3:gemma3-270m``: the pair its champions were trained with); another drafter without
    a reranker is refused in one line. None: the strategy takes no named champion."""
    if strategy != "reranked":
        return None
    named = champion_name(reranker)
    if reranker is not None and named is None:
        return None
    spec = getattr(drafter, "spec", "") or type(drafter).__name__
    named = named or champion_for(spec)
    if named is None:
        pairs = "; ".join(f"reranker:{n} with {p.drafter}" for n, p in CHAMPIONS.items())
        raise StrategyError(f"strategy reranked needs a reranker (reranker=) for drafter {spec}: the named champions "
                            f"were trained with other drafters ({pairs})")
    return named


def resolve_strategy(strategy, reranker) -> SelectionStrategy:
    """A strategy object from a name or an object; ``reranked`` takes a fitted reranker or loads a local one."""
    if isinstance(strategy, SelectionStrategy):
        if reranker is not None:
            raise StrategyError("reranker= goes with strategy='reranked'; a strategy object carries its own")
        return strategy
    if not isinstance(strategy, str):
        raise StrategyError(f"strategy must be a name or a SelectionStrategy, got {type(strategy).__name__}")
    if strategy != "reranked" or reranker is None:
        return make_strategy(strategy, reranker)
    if not isinstance(reranker, (str, Path)):  # a fitted estimator: nothing to load
        return make_strategy("reranked", reranker, type(reranker).__name__)
    if names_a_uri(reranker):
        raise StrategyError(f"reranker {reranker}: an MLflow model URI; decoding takes a fitted reranker or a local "
                            f"file: load it first with specrank.tracking.resolve_reranker({str(reranker)!r}, "
                            "tracking_uri=...)")
    return make_strategy("reranked", load_reranker(reranker), str(reranker))
