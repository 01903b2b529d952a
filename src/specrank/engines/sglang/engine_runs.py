"""What SGLang's engine runs measured (``runner.py``'s JSON), read without the engine, and checked against
``specrank tree-config``'s prediction (``benchmarks/bench_sglang.py``, docs/sglang.md).

The settings: SGLang's default shape for a Llama target, (num_steps, topk, num_draft_tokens) = (5, 4, 8) from
``_auto_choose_speculative_params``, and the champion's topk 10 at B = 8, (3, 10, 9). A run's figures: accept length
(1 + correct drafts a verify step, the bonus token counted), tokens/s, greedy identity with plain decoding and where
each other output first parts from it; the plugin's gain over SGLang's own tree with a paired prompt-bootstrap interval.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# a setting's engine runs in the results: SGLang's own tree, and the plugin's (its gain is <plugin>_gain)
ENGINE_KEYS = {"champion_b8": ("sglang", "plugin"), "sglang_default": ("sglang_default", "plugin_default")}
TOPK4 = "topk-4 refit"  # the champion's kind refitted on topk-4 pools of its training prompts (bench_sglang.py)
# name -> (topk, num_steps, num_draft_tokens, the plugin's reranker)
SETTINGS = {"sglang_default": (4, 5, 8, TOPK4), "champion_b8": (10, 3, 9, "reranker:default")}


def chosen_settings(names: str | None, gain_only: bool) -> list[str]:
    """The settings a comma list names, in ``SETTINGS``' order; None: both, or the champion's alone with
    ``gain_only``. An unknown name or an empty list raises ``ValueError`` naming it."""
    if names is None:
        names = "champion_b8" if gain_only else ",".join(SETTINGS)
    unknown = [s for s in names.split(",") if s not in SETTINGS]
    if unknown or not names:
        raise ValueError(f"{unknown[0] if unknown else 'empty'} is not one of {', '.join(SETTINGS)}")
    return [s for s in SETTINGS if s in names.split(",")]


def engine_figures(run: dict, plain: dict | None) -> dict:
    """Accept length (1 + correct drafts a verify step, the bonus token counted), tokens/s over decode time, and
    greedy identity with plain decoding, per prompt and pooled."""
    rows = run["rows"]
    out = {"tokens": sum(len(r["output_ids"]) for r in rows), "seconds": sum(r["seconds"] for r in rows)}
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    verify = sum(r["verify_ct"] for r in rows)
    if verify:
        out.update({"verify_steps": verify, "accept_length": 1 + sum(r["correct_drafts"] for r in rows) / verify,
                    "ms_per_step": 1000 * out["seconds"] / verify})
    if plain is not None:
        same = [a["output_ids"] == b["output_ids"] for a, b in zip(rows, plain["rows"])]
        out["identical_to_plain"] = f"{sum(same)}/{len(same)}"
        # where each other prompt first differs from plain decoding: (prompt, token index, plain's, this run's)
        out["first_differences"] = [first_difference(a, b) for a, b, ok in zip(rows, plain["rows"], same) if not ok]
    return out


def first_difference(row: dict, plain: dict) -> tuple:
    """(prompt, index, plain's token, this run's token) at the first token where two outputs part; None past an
    output's end."""
    a, b = row["output_ids"], plain["output_ids"]
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return row["id"], i, b[i] if i < len(b) else None, a[i] if i < len(a) else None


def paired_gain(own: dict, plugin: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """The plugin's accept length minus SGLang's own, pooled over prompts, with a paired prompt-bootstrap interval."""
    (ca, va), (cb, vb) = accept_columns(own), accept_columns(plugin)
    idx = np.random.default_rng(seed).integers(0, len(ca), (n_boot, len(ca)))
    boot = cb[idx].sum(1) / vb[idx].sum(1) - ca[idx].sum(1) / va[idx].sum(1)
    point = cb.sum() / vb.sum() - ca.sum() / va.sum()
    return {"gain": float(point), "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975))}


def accept_columns(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """A run's correct drafts and verify steps, one entry per prompt."""
    return (np.array([r["correct_drafts"] for r in run["rows"]], float),
            np.array([r["verify_ct"] for r in run["rows"]], float))


def earlier_engine(path: Path, figures: dict) -> dict:
    """The engine figures of an earlier results file at ``path``; ``ValueError`` unless it decoded the same prompts,
    tokens and settings as ``figures`` and holds an engine part."""
    if not path.is_file():
        raise ValueError(f"no such results file ({path})")
    earlier = json.loads(path.read_text())["figures"]
    for key in ("prompt_ids", "max_new_tokens", "settings"):
        if earlier.get(key) != figures[key]:
            raise ValueError(f"its {key} differ from this run's")
    if "engine" not in earlier:
        raise ValueError("it holds no engine part")
    return earlier["engine"] | {"from_results": path.name}


def inside_predicted(figures: dict) -> None:
    """Mark, for each setting and temperature both parts cover, whether the engine's measured plugin gain lies
    inside tree-config's predicted interval and inside its run interval, and the other way round: whether the
    predicted gain lies inside the measured one; and whether each measured accept length lies inside its predicted
    interval. The predicted interval resamples the prompts of rounds scored by their exact acceptance
    expectations: it bounds the expected gain. The run interval widens it by the sampling spread of each run's
    accept counts: where one engine run's gain should fall. The champion's marks carry no prefix, the default
    shape's ``default_``."""
    for t in ("t0", "t1"):
        fig = figures["engine"].get(t, {})
        for name, (own, plugin) in ENGINE_KEYS.items():
            pred = figures["predicted"].get(f"{name}_{t}")
            if pred:
                mark_gain(fig, pred, plugin, "" if name == "champion_b8" else "default_")
                mark_lengths(fig, pred, own, plugin)


def mark_gain(fig: dict, pred: dict, plugin: str, mark: str) -> None:
    """One setting's measured gain against its predicted intervals, and its predicted gain against the measured."""
    if f"{plugin}_gain" not in fig or "plugin_gain" not in pred:
        return
    measured = fig[f"{plugin}_gain"]
    fig[f"{mark}gain_inside_predicted_interval"] = \
        pred["plugin_gain_low"] <= measured["gain"] <= pred["plugin_gain_high"]
    fig[f"{mark}predicted_gain_inside_measured_interval"] = measured["low"] <= pred["plugin_gain"] <= measured["high"]
    if "plugin_gain_run_low" in pred:  # where one run's gain should fall: tree-config's run interval
        fig[f"{mark}gain_inside_predicted_run_interval"] = \
            pred["plugin_gain_run_low"] <= measured["gain"] <= pred["plugin_gain_run_high"]


def mark_lengths(fig: dict, pred: dict, own: str, plugin: str) -> None:
    """Whether SGLang's tree's and the plugin's measured accept lengths lie inside their predicted intervals."""
    for run, key in ((own, "draft"), (plugin, "plugin")):
        if "accept_length" in fig.get(run, {}) and f"{key}_low" in pred:
            fig[run]["inside_predicted_interval"] = \
                pred[f"{key}_low"] <= fig[run]["accept_length"] <= pred[f"{key}_high"]
