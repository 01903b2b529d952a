"""The per-prompt loop: prefill, rounds until EOS or ``max_new_tokens``, the emitted tokens."""

from __future__ import annotations

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.round import PromptState, decode_round, start_prompt
from specrank.decode.engine.timer import Timer
from specrank.decode.verify import ExhaustiveVerifier


def eos_token_ids(target) -> set:
    """EOS ids of the target (generation config and tokenizer)."""
    ids = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        ids.add(int(target.tokenizer.eos_token_id))
    return ids


def is_finished(state: PromptState, eos_ids, config: DecodeConfig) -> bool:
    """Stop after the round in which EOS appears or the output reaches max_new_tokens."""
    return len(state.output) >= config.max_new_tokens or not eos_ids.isdisjoint(state.output)


def final_output(output: list, eos_ids, max_new_tokens: int) -> list:
    """The emitted tokens cut after the first EOS and at ``max_new_tokens``."""
    out = output[:max_new_tokens]
    stops = [i for i, t in enumerate(out) if t in eos_ids]
    return out[: stops[0] + 1] if stops else out


def iter_rounds(target, drafter, prompt_ids, config: DecodeConfig, round_fn, *, prompt_id: str = "0",
                task: str = "", timer: Timer | None = None, with_rows: bool = False):
    """Yield ``round_fn(state) -> (tokens emitted, record)``'s record (None: none kept) after every round.

    The last value the generator returns (``StopIteration.value``) is the final output token ids.
    """
    timer = timer or Timer()
    eos = eos_token_ids(target)
    with timer.span("total"):
        state = start_prompt(target, drafter, prompt_ids, config, prompt_id, timer, with_rows)
        state.task = task
        while not is_finished(state, eos, config):
            tokens, record = round_fn(state)
            timer.rounds += 1
            timer.tokens += tokens
            yield record
    return final_output(state.output, eos, config.max_new_tokens)


def decode_prompt(target, drafter, prompt_ids, config: DecodeConfig, strategy, *, verifier=None,
                  observer=None, prompt_id: str = "0", task: str = "", timer: Timer | None = None):
    """Decode one prompt with ``strategy``; return (output token ids, the observer's round records)."""
    verifier = verifier or ExhaustiveVerifier(config.temperature)
    strategy.check(config)
    timer = timer or Timer()

    def round_fn(state):
        return decode_round(target, drafter, state, config, verifier, strategy, timer, observer)

    with_rows = strategy.needs_rows or bool(observer is not None and observer.wants_rows)
    return run_rounds(iter_rounds(target, drafter, prompt_ids, config, round_fn, prompt_id=prompt_id, task=task,
                                  timer=timer, with_rows=with_rows))


def run_rounds(rounds) -> tuple[list, list]:
    """Drain an ``iter_rounds`` generator: (output token ids, records that are not None)."""
    records = []
    while True:
        try:
            record = next(rounds)
        except StopIteration as done:
            return done.value, records
        if record is not None:
            records.append(record)
