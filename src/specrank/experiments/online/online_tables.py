"""Statistics of online decoding runs: realized vs expected acceptance, the time split, speed ratios and
realized gains, with paired prompt-bootstrap intervals (torch-free: the tables ``specrank online`` writes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specrank.atomic import atomic_write, write_parquet_atomic
from specrank.evaluation.figures import acceptance_figure
from specrank.selection import PromptBootstrap
from specrank.selection.stats import _interval


class OnlineStatsError(ValueError):
    """Online tables that cannot give the asked statistic (a base strategy that did not run)."""


def acceptance_summary(rounds: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per strategy: mean ``realized``, ``expected`` (its own tree's value given the round's draw) and each
    ``expected_<score>`` with prompt-bootstrap intervals, and realized minus expected on the same rounds.

    ``rounds``: one row per round with ``strategy``, ``prompt_id``, ``realized`` and ``expected*`` columns.
    """
    rows = []
    for strategy, part in rounds.groupby("strategy", sort=False):
        boot = PromptBootstrap(part["prompt_id"].to_numpy(), n_boot, seed)
        cols = {c: part[c].to_numpy(float) for c in part.columns if c == "realized" or c.startswith("expected")}
        usable = {k: v for k, v in cols.items() if not np.isnan(v).any()}
        tot = boot.totals(usable)
        stats = {col: tot.mean(col) for col in usable}
        if "expected" in usable:
            stats["realized_minus_expected"] = tot.gain("realized", "expected")
        for name, iv in stats.items():
            rows.append({"strategy": strategy, "statistic": name, "mean": iv.point, "low": iv.low, "high": iv.high,
                         "rounds": len(part), "prompts": len(boot.prompts)})
    return pd.DataFrame(rows)


def strategy_table(decodes: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: tokens, target passes, tokens per pass, tokens/s, the summed wall-time split and, when
    timed, ``root_pass_hidden_share``: the share of root-pass time spent while the drafter drafted."""
    seconds = [c for c in decodes.columns if c.endswith("_s")]
    t = decodes.groupby("strategy", sort=False)[["tokens", "rounds", "passes", "seconds"] + seconds].sum()
    t["tokens_per_pass"] = t["tokens"] / t["passes"]
    t["tokens_per_s"] = t["tokens"] / t["seconds"]
    for c in seconds:
        t[c.replace("_s", "_share")] = t[c] / t["seconds"]
    if {"root_pass_hidden_s", "root_pass_s"} <= set(t.columns):  # pipelined decoding: root pass under drafting
        t["root_pass_hidden_share"] = t["root_pass_hidden_s"] / t["root_pass_s"].where(t["root_pass_s"] > 0)
    return t.reset_index()


def speed_ratios(decodes: pd.DataFrame, base: str, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> pd.DataFrame:
    """Speed of each strategy over ``base`` (summed tokens / summed seconds), paired prompt bootstrap.

    ``decodes``: one row per (prompt, strategy) with ``prompt_id``, ``strategy``, ``tokens``, ``seconds``.
    """
    tokens = decodes.pivot(index="prompt_id", columns="strategy", values="tokens")
    seconds = decodes.pivot(index="prompt_id", columns="strategy", values="seconds")
    if base not in tokens.columns:
        raise OnlineStatsError(f"speed base {base!r} was not run")
    if tokens.isna().any().any():
        raise OnlineStatsError("speed ratios need every strategy on every prompt")
    w = PromptBootstrap(tokens.index.to_numpy(), n_boot, seed, level).weights  # (R, P), prompts sorted
    tail = 100 * (1 - level) / 2
    speed = lambda wt, d: (wt @ tokens[d].to_numpy(float)) / (wt @ seconds[d].to_numpy(float))  # noqa: E731
    ones = np.ones(len(tokens))
    rows = []
    for d in tokens.columns:
        ratio = speed(w, d) / speed(w, base)
        low, high = np.percentile(ratio, [tail, 100 - tail])
        rows.append({"strategy": d, "base": base, "tokens_per_s": float(speed(ones, d)),
                     "ratio": float(speed(ones, d) / speed(ones, base)), "low": float(low), "high": float(high)})
    return pd.DataFrame(rows)


def root_overlap(decodes: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per strategy with root passes: the share of root-pass time spent while the drafter drafted (pipelined
    decoding; 0 when serial), with a prompt-bootstrap interval, and milliseconds per round of the drafter's
    own drafting, the target's wait for the pool, root and tree passes.

    ``decodes``: the decodes table (``root_pass_hidden_s``, ``root_pass_s``, ``drafter_busy_s``, ``draft_s``, ...).
    """
    rows = []
    for strategy, part in decodes.groupby("strategy", sort=False):
        if part["root_pass_s"].sum() <= 0:
            continue
        cols = {c: part[c].to_numpy(float) for c in ("root_pass_hidden_s", "root_pass_s")}
        iv = PromptBootstrap(part["prompt_id"].to_numpy(), n_boot, seed).totals(cols).ratio(
            [("root_pass_hidden_s", 1)], [("root_pass_s", 1)])
        per_round = {f"{c.removesuffix('_s')}_ms": 1000 * part[c].sum() / part["rounds"].sum()
                     for c in ("drafter_busy_s", "draft_s", "root_pass_s", "tree_pass_s")}
        rows.append({"strategy": strategy, "hidden": iv.point, "low": iv.low, "high": iv.high, **per_round})
    return pd.DataFrame(rows)


def realized_gain(rounds: pd.DataFrame, strategy: str, base: str, n_boot: int = 2000, seed: int = 0):
    """Mean realized acceptance of ``strategy`` minus ``base`` at their own contexts; prompts resampled
    jointly for both (App. D.3). Returns an ``Interval``."""
    parts = {d: rounds[rounds["strategy"] == d] for d in (strategy, base)}
    if any(p.empty for p in parts.values()):
        raise OnlineStatsError(f"realized gain needs rounds of both {strategy!r} and {base!r}")
    boot = PromptBootstrap(rounds["prompt_id"].to_numpy(), n_boot, seed)
    means = []
    for part in parts.values():
        idx = np.searchsorted(boot.prompts, part["prompt_id"].to_numpy())
        sums = np.bincount(idx, weights=part["realized"].to_numpy(float), minlength=len(boot.prompts))
        counts = np.bincount(idx, minlength=len(boot.prompts)).astype(float)
        means.append(((sums.sum() / counts.sum()), (boot.weights @ sums) / (boot.weights @ counts)))
    point = means[0][0] - means[1][0]
    return _interval(point, means[0][1] - means[1][1], boot.level)


def online_tables(rounds: pd.DataFrame, decodes: pd.DataFrame, base: str, n_boot: int = 2000,
                  seed: int = 0) -> dict[str, pd.DataFrame]:
    """The tables of an online run (``decode.runs.run_protocol``'s rounds and decodes): themselves, realized
    against expected acceptance, each strategy's speed, and speed ratios over ``base``."""
    return {
        "online_rounds": rounds,
        "online_decodes": decodes,
        "online_acceptance": acceptance_summary(rounds, n_boot, seed),
        "online_strategies": strategy_table(decodes),
        "online_speed": speed_ratios(decodes, base, n_boot, seed),
    }


def write_online_tables(tables: dict, out_dir) -> None:
    """Each of ``online_tables`` as Parquet and the realized-acceptance figure as PNG under ``out_dir`` (each
    atomic)."""
    out = Path(out_dir)
    for name, frame in tables.items():
        write_parquet_atomic(frame, out / f"{name}.parquet")
    fig = acceptance_figure(tables["online_acceptance"])
    atomic_write(out / "realized_acceptance.png", lambda tmp: fig.savefig(tmp, format="png", dpi=120))
