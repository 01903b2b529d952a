"""vLLM's speculative-decoding counters read without vLLM (``specrank.engines.vllm.metrics``). The fixtures are written in
vLLM's own names and shapes: ``vllm/v1/metrics/reader.py`` returns ``Counter(name, labels, value: int)`` for each
counter and engine and, for the per-position counter alone, ``Vector(name, labels, values: list[int])``
(``vllm/v1/spec_decode/metrics.py`` registers the names). A renamed counter must fail loudly, never read as zero."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, fields

import pytest

from specrank.engines.vllm.metrics import (
    ACCEPTED_PER_POSITION,
    DRAFTS,
    EngineMetricsError,
    SpecDecodeCounts,
    generation_tokens,
    metric_records,
    parse_version,
    serves_static_trees,
    spec_decode_counts,
)


@dataclass
class Metric:  # vllm.v1.metrics.reader.Metric
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]


def snapshot(engines=((48, 96, 15, [13, 2]),), model="SmolLM2-135M-Instruct"):
    """``LLM.get_metrics()`` after a k = 2 run: one set of counters per engine, with the metrics around them."""
    out = [Gauge("vllm:num_requests_running", {"model_name": model, "engine": "0"}, 0.0),
           Histogram("vllm:time_to_first_token_seconds", {"model_name": model, "engine": "0"}, 3, 0.2,
                     {"0.1": 3, "+Inf": 3})]
    for i, (drafts, draft_tokens, accepted, per_pos) in enumerate(engines):
        labels = {"model_name": model, "engine": str(i)}
        out += [Counter("vllm:spec_decode_num_drafts", labels, drafts),
                Counter("vllm:spec_decode_num_draft_tokens", labels, draft_tokens),
                Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
                Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_pos),
                Counter("vllm:generation_tokens", labels, 64)]
    return out


def test_the_counters_of_a_run_and_what_follows_from_them():
    c = spec_decode_counts(snapshot())
    assert c == SpecDecodeCounts(48, 96, 15, (13, 2))
    assert c.acceptance_length == pytest.approx(1 + 15 / 48)
    assert c.position_rates == pytest.approx((13 / 48, 2 / 48))
    assert generation_tokens(snapshot()) == 64


def test_engines_add_up_and_snapshots_subtract():
    two = spec_decode_counts(snapshot(((48, 96, 15, [13, 2]), (10, 20, 5, [4, 1]))))
    assert two == SpecDecodeCounts(58, 116, 20, (17, 3))
    later = spec_decode_counts(snapshot(((60, 120, 20, [16, 4]),)))
    assert later - spec_decode_counts(snapshot()) == SpecDecodeCounts(12, 24, 5, (3, 2))


def test_the_json_records_the_engine_side_hands_over_read_the_same():
    records = json.loads(json.dumps(metric_records(snapshot())))
    assert {r["type"] for r in records} == {"Counter", "Vector", "Gauge", "Histogram"}
    assert spec_decode_counts(records) == spec_decode_counts(snapshot())


def test_a_renamed_or_missing_counter_fails_loudly():
    renamed = [Counter("vllm:spec_decode_num_drafts_total", m.labels, m.value) if m.name == DRAFTS else m
               for m in snapshot()]
    with pytest.raises(EngineMetricsError, match="no vllm:spec_decode_num_drafts .*num_drafts_total"):
        spec_decode_counts(renamed)
    with pytest.raises(EngineMetricsError, match="speculative decoding off"):
        spec_decode_counts([m for m in snapshot() if "spec_decode" not in m.name])
    with pytest.raises(EngineMetricsError, match="no vllm:generation_tokens"):
        generation_tokens([m for m in snapshot() if m.name != "vllm:generation_tokens"])


def test_a_counter_of_another_shape_fails_loudly():
    as_counters = [Counter(m.name, m.labels, sum(m.values)) if m.name == ACCEPTED_PER_POSITION else m
                   for m in snapshot()]
    with pytest.raises(EngineMetricsError, match="expected a Vector"):
        spec_decode_counts(as_counters)
    as_gauge = [Gauge(m.name, m.labels, float(m.value)) if m.name == DRAFTS else m for m in snapshot()]
    with pytest.raises(EngineMetricsError, match="spec_decode_num_drafts: expected a Counter"):
        spec_decode_counts(as_gauge)
    with pytest.raises(EngineMetricsError, match="non-negative integer"):
        spec_decode_counts([Counter(m.name, m.labels, 1.5) if m.name == DRAFTS else m for m in snapshot()])
    # every accepted token counts at one position: positions that no longer add up mean the meaning moved
    with pytest.raises(EngineMetricsError, match="sums to 16"):
        spec_decode_counts(snapshot(((48, 96, 15, [13, 3]),)))


def test_which_releases_serve_static_trees():
    assert parse_version("0.32.0") == (0, 32, 0) and parse_version("v0.10.1.1") == (0, 10, 1)
    assert parse_version("0.20.2+cpu") == (0, 20, 2) and parse_version("0.21") == (0, 21, 0)
    assert [serves_static_trees(v) for v in ("0.10.0", "0.10.1", "0.20.2", "0.21.0", "0.32.0")] == \
        [False, True, True, False, False]
    with pytest.raises(ValueError, match="vLLM version 'latest'"):
        parse_version("latest")


def test_reading_the_counters_imports_no_engine():
    code = "import sys, specrank.engines.vllm.metrics; sys.exit('vllm' in sys.modules or 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_the_fixtures_have_the_installed_vllms_shapes():
    from vllm.v1.metrics import reader

    for ours, theirs in ((Counter, reader.Counter), (Vector, reader.Vector)):
        assert [f.name for f in fields(ours)] == [f.name for f in fields(theirs)]
