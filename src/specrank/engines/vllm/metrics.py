"""vLLM's speculative-decoding counters, as ``LLM.get_metrics()`` returns them, and which vLLM releases serve
which speculative settings. Nothing here imports vLLM: the counters are read from the objects (or their JSON
records) by name and shape, so the code that decodes with vLLM can live in vLLM's own environment and hand its
metrics over as JSON.

The names and shapes are vLLM's (``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/reader.py``): three
``Counter`` s (an integer ``value``) and one ``Vector`` (an integer list ``values``, position d - 1 counting the
drafts that accepted at least d tokens), each once per engine (label ``engine``), summed here. A metric that is
missing or of another shape raises ``EngineMetricsError`` naming it, so a renamed counter fails loudly instead of
reading as zero acceptance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS)

# Static trees (`speculative_token_tree`) are served by the releases that ship vLLM's tree-attention backend
# (`vllm/v1/attention/backends/tree_attn.py`, vLLM PR #20401): 0.10.1 is the first, 0.20.2 the last. vLLM PR
# #42121 ("Remove tree attention", merged 2026-05-08) removed both the backend and the config field: 0.21.0 on
# refuse the field. Read from the released wheels (0.10.0 has the field but no backend).
FIRST_WITH_TREES = (0, 10, 1)
LAST_WITH_TREES = (0, 20, 2)


class EngineMetricsError(ValueError):
    """An engine's metrics lack a counter specrank reads, or hold it in another shape; the message names it."""


@dataclass(frozen=True)
class SpecDecodeCounts:
    """vLLM's speculative-decoding counters, summed over engines: drafts (verification steps that verified at
    least one draft token), draft tokens proposed, draft tokens accepted, and per position d the drafts that
    accepted at least d tokens."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]

    def __sub__(self, before: SpecDecodeCounts) -> SpecDecodeCounts:
        """The counts between two snapshots of the same engine (``after - before``)."""
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        a = self.accepted_per_position + (0,) * (width - len(self.accepted_per_position))
        b = before.accepted_per_position + (0,) * (width - len(before.accepted_per_position))
        return SpecDecodeCounts(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                                self.accepted_tokens - before.accepted_tokens, tuple(x - y for x, y in zip(a, b)))

    @property
    def acceptance_length(self) -> float:
        """Tokens a verification step emits: 1 (the target's own token: the correction, or the bonus after a fully
        accepted draft) + accepted draft tokens per draft, as vLLM's ``mean acceptance length`` logs it."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else float("nan")

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Per position d: the share of drafts that accepted at least d tokens."""
        return tuple(v / self.drafts if self.drafts else float("nan") for v in self.accepted_per_position)

    def as_dict(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "acceptance_length": self.acceptance_length, "position_rates": list(self.position_rates)}


def metric_records(metrics) -> list[dict]:
    """vLLM's metric objects (``LLM.get_metrics()``) as JSON records ``{name, type, labels, value | values}``,
    the type being the reader's class name; histograms keep their count and sum only."""
    records = []
    for m in metrics:
        record = {"name": m.name, "type": type(m).__name__, "labels": dict(getattr(m, "labels", {}) or {})}
        for field in ("value", "values", "count", "sum"):
            if hasattr(m, field):
                value = getattr(m, field)
                record[field] = list(value) if field == "values" else value
        records.append(record)
    return records


def _record(m) -> dict:
    return m if isinstance(m, dict) else metric_records([m])[0]


def _integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise EngineMetricsError(f"vLLM metric {name}: expected a non-negative integer count, got {value!r}")
    return int(value)


def spec_decode_counts(metrics) -> SpecDecodeCounts:
    """The speculative-decoding counters of a metrics snapshot (vLLM's objects or ``metric_records``), summed
    over engines. Raises ``EngineMetricsError`` naming each counter that is missing or not of vLLM's shape."""
    records = [_record(m) for m in metrics]
    found = {r["name"] for r in records}
    missing = [n for n in (*COUNTERS, ACCEPTED_PER_POSITION) if n not in found]
    if missing:
        near = sorted(n for n in found if "spec_decode" in n)
        raise EngineMetricsError(f"vLLM metrics: no {', '.join(missing)} (renamed in this vLLM, or speculative"
                                 f" decoding off?); spec-decode metrics present: {', '.join(near) or 'none'}")
    totals = dict.fromkeys(COUNTERS, 0)
    per_position: list[int] = []
    for r in records:
        if r["name"] in totals:
            if r.get("type") != "Counter" or "value" not in r:
                raise EngineMetricsError(f"vLLM metric {r['name']}: expected a Counter with a value, got"
                                         f" {r.get('type')} with {sorted(k for k in r if k not in ('name', 'type'))}")
            totals[r["name"]] += _integer(r["value"], r["name"])
        elif r["name"] == ACCEPTED_PER_POSITION:
            values = r.get("values")
            if r.get("type") != "Vector" or not isinstance(values, (list, tuple)):
                raise EngineMetricsError(f"vLLM metric {ACCEPTED_PER_POSITION}: expected a Vector of per-position"
                                         f" counts, got {r.get('type')}")
            values = [_integer(v, ACCEPTED_PER_POSITION) for v in values]
            per_position += [0] * (len(values) - len(per_position))
            per_position = [a + b for a, b in zip(per_position, values + [0] * (len(per_position) - len(values)))]
    counts = SpecDecodeCounts(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED_TOKENS], tuple(per_position))
    if sum(counts.accepted_per_position) != counts.accepted_tokens:
        # every accepted token is counted at exactly one position: a mismatch means the shapes moved
        raise EngineMetricsError(f"vLLM metrics: {ACCEPTED_PER_POSITION} sums to {sum(counts.accepted_per_position)},"
                                 f" {ACCEPTED_TOKENS} is {counts.accepted_tokens}")
    return counts


def generation_tokens(metrics) -> int:
    """``vllm:generation_tokens``, summed over engines (tokens the engine generated, bonus tokens included)."""
    records = [_record(m) for m in metrics if _record(m)["name"] == GENERATION_TOKENS]
    if not records:
        raise EngineMetricsError(f"vLLM metrics: no {GENERATION_TOKENS} counter")
    return sum(_integer(r.get("value"), GENERATION_TOKENS) for r in records)


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM version string ('0.32.0', '0.20.2+cpu', 'v0.10.1.1', '0.21')."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if m is None:
        raise ValueError(f"vLLM version {text!r}: expected MAJOR.MINOR[.PATCH], e.g. 0.32.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def serves_static_trees(version: str) -> bool:
    """Whether vLLM ``version`` drafts ``speculative_token_tree`` (0.10.1 to 0.20.2; PR #42121 removed it)."""
    return FIRST_WITH_TREES <= parse_version(version) <= LAST_WITH_TREES


def version_name(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))
