"""Where a decoding round's time goes on a device, from a torch profile: each timed host span's wall time and the
device-busy time inside it (``benchmarks/bench_gpu.py`` labels the spans ``span:NAME`` with
``torch.profiler.record_function``). A span whose device is idle most of its wall time waits on the host
(launches, synchronisations)."""

from __future__ import annotations

import bisect


def merged(intervals) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted disjoint intervals (kernels of several streams overlap:
    the device is busy once)."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def busy_within(busy, a: float, b: float) -> float:
    """How much of ``[a, b]`` the disjoint sorted intervals ``busy`` cover."""
    i = bisect.bisect_left(busy, (a,)) - 1
    total = 0.0
    for start, end in busy[max(i, 0):]:
        if start >= b:
            break
        total += max(0.0, min(end, b) - max(start, a))
    return total


def device_intervals(events) -> list[tuple[float, float]]:
    """The device activity of a profile (kernels, copies, fills), without the profiler's own annotations of the
    host's ranges on the device timeline."""
    from torch.autograd import DeviceType

    return [(e.time_range.start, e.time_range.end) for e in events
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
            and not e.name.startswith("span:")]


def host_spans(events) -> dict[str, list[tuple[float, float]]]:
    """{span name: its wall intervals on the host}, from the ``span:NAME`` ranges ``bookkeeping_profile`` labels."""
    from torch.autograd import DeviceType

    spans = {}
    for e in events:
        if e.name.startswith("span:") and e.device_type == DeviceType.CPU:
            spans.setdefault(e.name.removeprefix("span:"), []).append((e.time_range.start, e.time_range.end))
    return spans


def span_table(events, n: int, device: bool) -> dict:
    """Per timed span, and ``bookkeeping`` (the rounds' time outside them), milliseconds a round of wall time and,
    with ``device``, of device-busy time inside the span's wall intervals, and their ratio: a span whose device
    is idle most of its wall time waits on the host (launches, synchronisations)."""
    busy = merged(device_intervals(events)) if device else []
    us = {name: (sum(b - a for a, b in iv), sum(busy_within(busy, a, b) for a, b in iv))
          for name, iv in host_spans(events).items()}
    if "total" in us:
        inner = [v for name, v in us.items() if name != "total"]
        us["bookkeeping"] = tuple(t - sum(v[i] for v in inner) for i, t in enumerate(us["total"]))
    return {name: span_row(wall, gpu, n, device) for name, (wall, gpu) in us.items()}


def span_row(wall_us: float, busy_us: float, n: int, device: bool) -> dict:
    wall, busy = wall_us / 1000 / n, busy_us / 1000 / n
    if not device:
        return {"wall_ms": wall, "gpu_busy_ms": None, "gpu_busy_share": None}
    return {"wall_ms": wall, "gpu_busy_ms": busy, "gpu_busy_share": busy / wall if wall > 0 else None}
