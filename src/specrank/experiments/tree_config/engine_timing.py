"""An engine's speed predicted from its own step times (``specrank tree-config --engine-timing``,
docs/tree-config.md, "Predicting an engine's speed").

The cost model times specrank's own passes; a serving engine runs the same models in its own kernels, at its own
speed. Its absolute speed is not in the recording; the model carries the shape of specrank's costs over, with
scales fixed by what the user measured of the engine:

- verify: the engine's plain decode step (one token a pass) is its one-token verify, and a pass over n tokens
  adds a share ``growth`` of what specrank's adds: ``engine_verify(n) = plain_ms * (1 + growth * (verify(n) /
  verify(1) - 1))``;
- draft: a scale carries specrank's pool times onto what the measured speculative steps leave once their verify
  pass is paid: ``step_ms - engine_verify(n) = scale * draft(shape)``.

With one speculative setting timed, ``growth`` is 1 (the engine's verify grows as specrank's does) and the step
fixes the draft scale. With two or more, both are fitted by nonnegative least squares: an engine whose verify
pass costs the same for 1 to 5 tokens (vLLM's CPU build) gets a growth near 0. A setting's engine round is then
``engine_verify(n) + scale * draft(shape)``, and its tokens/s the recorded acceptance length over that round.

An engine's kernels need not cost more for more tokens. vLLM 0.32's CPU build multiplies through oneDNN, whose
matmul over 2 rows takes a third longer than over 3 on an AVX-512 EPYC, so its 2-token verify pass (k = 1) costs
more than its 3-token one, a shape no scale on specrank's passes reproduces. Passes over n tokens timed in the
engine itself (``nN=MS``: its forward and logits over N tokens, alone) replace the growth model: ``engine_verify(n)
= plain_ms + pass(n) - pass(1)``, interpolated between timed widths and left unpredicted (NaN) beyond the widest;
the draft scale alone is then fitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specrank.decode.runs.cost import CostModel

_CHAIN = re.compile(r"k(\d+)")  # vLLM's num_speculative_tokens, as a chain k1-s{k}-n{k+1}
_WIDTH = re.compile(r"n(\d+)")  # the engine's pass over N tokens, timed alone
_LABEL = re.compile(r"k(\d+)-s(\d+)-n(\d+)")  # a setting's label, e.g. k4-s3-n8


class EngineTimingError(ValueError):
    """A malformed ``--engine-timing`` (one line naming it)."""


@dataclass(frozen=True)
class EngineTiming:
    """Step times measured in an engine on the user's machine (ms): ``plain_ms`` its decode step without a
    drafter, ``measured`` ((setting label, ms a speculative step), ...), and optionally ``verify`` ((n, ms of its
    verify pass over n tokens, its forward and logits timed alone), ...), which must include n = 1."""

    plain_ms: float
    measured: tuple[tuple[str, float], ...]
    verify: tuple[tuple[int, float], ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.measured)


def setting_label(key: str) -> str:
    """A setting's label from ``kN`` (vLLM's chain of N tokens) or a full label ``k{topk}-s{steps}-n{tokens}``."""
    if _CHAIN.fullmatch(key):
        k = int(key[1:])
        return f"k1-s{k}-n{k + 1}"
    if _LABEL.fullmatch(key):
        return key
    raise EngineTimingError(f"--engine-timing: {key!r} is neither kN (a vLLM chain) nor a setting label"
                            " k{topk}-s{steps}-n{tokens}")


def engine_timing_text(plain_ms: float, steps: dict, verify: dict | None = None) -> str:
    """``--engine-timing`` for an engine's plain step, its chain steps at each k and its verify passes over n
    tokens (ms): the text ``parse_engine_timing`` reads."""
    return ",".join([f"plain={plain_ms:.4f}"] + [f"k{k}={ms:.4f}" for k, ms in sorted(steps.items())]
                    + [f"n{n}={ms:.4f}" for n, ms in sorted((verify or {}).items())])


def parse_engine_timing(text: str) -> EngineTiming:
    """``"plain=25.7,k1=28.8,k4-s3-n8=41.0"``: ms a step, ``plain`` and at least one speculative setting; and
    optionally ``n1=24.1,n2=30.2,...``: the engine's passes over n tokens (``n1`` among them)."""
    values, verify = {}, {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        try:
            ms = float(value)
        except ValueError:
            ms = float("nan")
        if not sep or not np.isfinite(ms) or ms <= 0:
            raise EngineTimingError(f"--engine-timing: {part!r}: expected NAME=MS with MS > 0")
        key = key.strip()
        if _WIDTH.fullmatch(key) and int(key[1:]) >= 1:
            verify[int(key[1:])] = ms
        else:
            values["plain" if key == "plain" else setting_label(key)] = ms
    if "plain" not in values or len(values) < 2:
        raise EngineTimingError(f"--engine-timing {text!r}: expected plain=MS and at least one setting, e.g."
                                " plain=25.7,k1=28.8")
    if verify and 1 not in verify:
        raise EngineTimingError(f"--engine-timing {text!r}: passes over n tokens need n1, the one-token pass they"
                                " are measured from")
    plain = values.pop("plain")
    return EngineTiming(plain, tuple(sorted(values.items())), tuple(sorted(verify.items())))


def check_timed_settings(timing: EngineTiming, settings) -> None:
    """Every timed setting must be one the grid scores, and within the timed passes where there are some (checked
    before any model loads)."""
    labels = {s.label for s in settings}
    missing = [label for label in timing.labels if label not in labels]
    if missing:
        raise EngineTimingError(f"--engine-timing: {', '.join(missing)} not in the scored settings; add it to the"
                                " grid (--vllm-tokens, --topk/--num-steps/--num-draft-tokens)")
    widest = max((n for n, _ in timing.verify), default=None)
    wider = [s.label for s in settings if s.label in timing.labels and widest and s.num_draft_tokens > widest]
    if wider:
        raise EngineTimingError(f"--engine-timing: {', '.join(wider)} verify more tokens than the widest timed pass"
                                f" n{widest}; time the engine's pass at their width")


def extra_widths(timing: EngineTiming | None) -> tuple[int, ...]:
    """Verify widths the engine scales need besides the settings' own: the one-token pass of plain decoding."""
    return () if timing is None else (1,)


@dataclass(frozen=True)
class EngineScales:
    """How the engine's costs relate to specrank's: ``growth``, the share of specrank's verify growth with its
    tokens that the engine's pass shows, and ``draft``, the factor on specrank's pool times."""

    growth: float
    draft: float


def engine_scales(timing: EngineTiming, cost: CostModel, settings) -> EngineScales:
    """The scales that carry ``cost`` onto the engine's timed steps: the draft scale alone (growth 1, or the
    engine's own passes where timed) by least squares from the timed settings; with two or more and no passes,
    both by nonnegative least squares."""
    from scipy.optimize import nnls  # scipy (with scikit-learn): loaded only when an engine is timed

    by_label = {s.label: s for s in settings}
    plain = timing.plain_ms / 1000
    rows, y = [], []
    for label, ms in timing.measured:
        s = by_label[label]
        rows.append((plain * (cost.verify[s.num_draft_tokens] / cost.verify[1] - 1), cost.draft[s.draft_shape]))
        y.append(ms / 1000 - plain)  # what the step spends beyond a plain one
    a, y = np.asarray(rows), np.asarray(y)
    if timing.verify:  # the verify pass is the engine's own: only drafting is scaled
        verify = np.array([engine_verify_seconds(timing, cost, by_label[label].num_draft_tokens, 1.0) - plain
                           for label, _ in timing.measured])
        x, rest = a[:, 1], y - verify  # every timed setting lies within the passes (check_timed_settings)
        return EngineScales(1.0, float(max(0.0, (x @ rest) / (x @ x))))
    if len(y) == 1:
        growth_part, x = a[:, 0], a[:, 1]
        return EngineScales(1.0, float(max(0.0, (x @ (y - growth_part)) / (x @ x))))
    (growth, draft), _ = nnls(a, y)
    return EngineScales(float(growth), float(draft))


def engine_verify_seconds(timing: EngineTiming, cost: CostModel, n: int, growth: float) -> float:
    """The engine's verify pass over ``n`` tokens: from its own timed passes (interpolated between them, NaN
    beyond the widest), or else from specrank's pass grown by ``growth``."""
    if timing.verify:
        widths, ms = (np.asarray(v, float) for v in zip(*timing.verify))
        if n > widths.max():
            return float("nan")
        return (timing.plain_ms + float(np.interp(n, widths, ms)) - ms[widths == 1][0]) / 1000
    return timing.plain_ms / 1000 * (1 + growth * (cost.verify[n] / cost.verify[1] - 1))


def engine_round_seconds(timing: EngineTiming, cost: CostModel, settings) -> dict[str, float]:
    """{label: the engine's seconds a round} for every setting (NaN where its verify is wider than every timed
    pass)."""
    scales = engine_scales(timing, cost, settings)
    return {s.label: engine_verify_seconds(timing, cost, s.num_draft_tokens, scales.growth)
            + scales.draft * cost.draft[s.draft_shape] for s in settings}


def with_engine_speed(table: pd.DataFrame, seconds: dict[str, float], timing: EngineTiming) -> pd.DataFrame:
    """``table`` with the engine's round and tokens/s (interval from the acceptance length's), and whether the
    setting's step was one the scales were fitted on (``engine_timed``)."""
    out = table.copy()
    rs = out["setting"].map(seconds).astype(float)
    out["engine_round_seconds"] = rs
    for suffix, column in (("", "draft_length"), ("_low", "draft_low"), ("_high", "draft_high")):
        out[f"engine_tokens_per_s{suffix}"] = out[column] / rs
    out["engine_timed"] = out["setting"].isin(timing.labels)
    return out
