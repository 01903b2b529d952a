"""benchmarks/bench_sglang.py's reading of SGLang's per-request counters, with no engine: accept length, greedy
identity and first differences against plain decoding, and the paired prompt-bootstrap gain, with controls."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_sglang import engine_figures, paired_gain  # noqa: E402


def run(rows):
    """A ``sglang_engine_run.py`` output: (id, output ids, verify steps, correct drafts) per prompt, 1 s each."""
    return {"rows": [{"id": i, "output_ids": out, "seconds": 1.0, "verify_ct": v, "correct_drafts": c,
                      "completion_tokens": len(out)} for i, out, v, c in rows]}


def test_accept_length_counts_the_bonus_token_and_differences_name_their_first_token():
    plain = run([("a", [1, 2, 3, 4], 0, 0), ("b", [5, 6, 7, 8], 0, 0), ("c", [9, 9], 0, 0)])
    spec = run([("a", [1, 2, 3, 4], 2, 2), ("b", [5, 6, 0, 8], 3, 1), ("c", [9, 9, 9], 1, 1)])
    fig = engine_figures(spec, plain)
    assert fig["accept_length"] == pytest.approx(1 + 4 / 6)  # SGLang's correct drafts a verify step, plus its bonus
    assert fig["identical_to_plain"] == "1/3"
    assert fig["first_differences"] == [("b", 2, 7, 0), ("c", 2, None, 9)]  # (prompt, index, plain's, this run's)
    assert "accept_length" not in engine_figures(plain, None)  # plain decoding verifies nothing
    assert "identical_to_plain" not in engine_figures(spec, None)  # no reference, no comparison


def test_the_paired_gain_finds_a_real_gain_and_none_where_there_is_none():
    rng = np.random.default_rng(0)
    verify = rng.integers(20, 40, 40)
    correct = rng.binomial(verify * 3, 0.2)
    rows = [(f"p{i}", [0], int(v), int(c)) for i, (v, c) in enumerate(zip(verify, correct))]
    own = run(rows)
    better = run([(i, o, v, c + v // 5) for i, o, v, c in rows])  # 0.2 more accepted a step on every prompt
    gain = paired_gain(own, better)
    assert gain["gain"] == pytest.approx(float(sum(v // 5 for v in verify) / verify.sum()))
    assert 0 < gain["low"] <= gain["gain"] <= gain["high"]
    same = paired_gain(own, own)  # control: the same run against itself gains nothing, with a zero-width interval
    assert same == {"gain": 0.0, "low": 0.0, "high": 0.0}
