"""The recorder: every round's pool with the exact target probability of every pool edge and the retained
rows read at its first-level candidates (docs/design.md, one round and retained rows), written shard by shard into a run
directory."""

from __future__ import annotations

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.prompt import decode_prompt
from specrank.decode.engine.timer import Timer
from specrank.decode.prompts import encode_prompts
from specrank.decode.runs.measure import Measure
from specrank.decode.runs.shards import open_run_dir, record_shards
from specrank.decode.runs.tables import rounds_table
from specrank.decode.strategies import DraftSelection


def record_prompt(target, drafter, prompt_ids, config: DecodeConfig, prompt_id: str = "0", task: str = "",
                  verifier=None, timer: Timer | None = None, strategy=None) -> tuple[list, list]:
    """Record one prompt: (output token ids, round records). Rounds verify ``strategy``'s tree (default: draft
    selection's top-B) and score every pool edge."""
    return decode_prompt(target, drafter, prompt_ids, config, strategy or DraftSelection(), verifier=verifier,
                         observer=Measure(record=True), prompt_id=prompt_id, task=task, timer=timer)


def recorder_work(target, drafter, prompts, config: DecodeConfig, verifier=None, timer: Timer | None = None,
                  strategy=None):
    """``(decode_one, tables)`` of the shard writer (``runs.shards.record_shards``) recording ``prompts``, each
    round verifying ``strategy``'s tree (default: draft selection's); every prompt is encoded (and checked against
    the context) first, so a bad one fails before any output."""
    encoded = encode_prompts(target, prompts, config)

    def decode_one(i):
        _, records = record_prompt(target, drafter, encoded[i], config, prompts[i].prompt_id, prompts[i].task,
                                   verifier, timer, strategy)
        return {"rounds": records}

    tables = {"rounds": lambda parts: rounds_table([r for p in parts for r in p], config.shape.size, config.shape.topk)}
    return decode_one, tables


def record_run(target, drafter, prompts, out_dir, config: DecodeConfig, manifest: dict, shard_size: int = 4,
               verifier=None, progress: bool = True, desc: str | None = None, strategy=None) -> Timer:
    """Record ``prompts`` into ``out_dir`` shard by shard, skipping finished ones, each round verifying
    ``strategy``'s tree (default: draft selection's); return the timer. The progress bar (``desc`` its label)
    shows rounds, accepted tokens a round and tokens/s."""
    timer = Timer()
    decode_one, tables = recorder_work(target, drafter, prompts, config, verifier, timer, strategy)
    out = open_run_dir(out_dir, manifest)

    def postfix():
        return {"rounds": timer.rounds, "accepted": f"{(timer.tokens / max(timer.rounds, 1)) - 1:.2f}",
                "tok_s": f"{timer.tokens / max(timer.total, 1e-9):.1f}"}

    record_shards(out, len(prompts), shard_size, decode_one, tables, progress=progress, postfix=postfix,
                  desc=desc)
    return timer
