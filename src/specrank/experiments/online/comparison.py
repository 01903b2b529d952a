"""Online comparison: decode prompts with selection strategies in the loop (a reranker included), every strategy
on every prompt in an order rotated per prompt, and measure realized against expected acceptance at the same
contexts and each strategy's speed over the first."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from specrank.decode import STRATEGY_NAMES, DecodeConfig, make_strategy
from specrank.decode.core import parse_device
from specrank.decode.loading.model_spec import Models, ModelSpec, loaded
from specrank.decode.pipeline import PipelinedDrafter
from specrank.decode.prompts import default_prompts_path, encode_prompts, read_prompts
from specrank.decode.runs import parse_strategies, run_protocol
from specrank.experiments.online.online_tables import online_tables, realized_gain, write_online_tables
from specrank.outputs import check_output_dir, staged
from specrank.workflow.champion import check_unseen_prompts
from specrank.workflow.tracking import Tracking

TABLES = ("online_rounds", "online_decodes", "online_acceptance", "online_strategies", "online_speed")


@dataclass
class OnlineComparison:
    """The tables of one online comparison (``online_rounds``: a row per round; ``online_decodes``: a row per
    (prompt, strategy); ``online_acceptance``, ``online_strategies``, ``online_speed``: per strategy), saved in
    ``path`` when it was given one."""

    tables: dict[str, pd.DataFrame] = field(repr=False)
    path: Path | None = None

    @classmethod
    def open(cls, path) -> OnlineComparison:
        """The comparison saved in folder ``path``."""
        path = Path(path)
        missing = [t for t in TABLES if not (path / f"{t}.parquet").is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: not an online comparison (no {missing[0]}.parquet)")
        return cls({t: pd.read_parquet(path / f"{t}.parquet") for t in TABLES}, path)

    @property
    def base(self) -> str:
        """The strategy speeds are relative to (the first)."""
        return str(self.tables["online_speed"]["base"].iloc[0])

    def realized(self, strategy: str) -> list[float]:
        """[mean, low, high] realized accepted draft tokens a round of ``strategy``."""
        return self._acceptance(strategy, "realized")

    def expected(self, strategy: str) -> list[float]:
        """[mean, low, high] expected accepted draft tokens a round of ``strategy``'s own trees at its contexts."""
        return self._acceptance(strategy, "expected")

    def _acceptance(self, strategy: str, statistic: str) -> list[float]:
        t = self.tables["online_acceptance"]
        r = t[(t["strategy"] == strategy) & (t["statistic"] == statistic)].iloc[0]
        return [float(r["mean"]), float(r["low"]), float(r["high"])]

    def realized_gain(self, strategy: str, n_boot: int = 2000, seed: int = 0) -> list[float]:
        """[point, low, high] realized accepted tokens a round of ``strategy`` minus the base strategy's."""
        iv = realized_gain(self.tables["online_rounds"], strategy, self.base, n_boot, seed)
        return [float(iv.point), float(iv.low), float(iv.high)]

    def speed(self, strategy: str) -> list[float]:
        """[ratio, low, high]: ``strategy``'s tokens/s over the base strategy's (paired prompt bootstrap)."""
        r = self.tables["online_speed"].set_index("strategy").loc[strategy]
        return [float(r["ratio"]), float(r["low"]), float(r["high"])]

    def summary(self) -> list[str]:
        """One line per strategy: realized acceptance, tokens per pass, tokens/s and speed over the base."""
        acc = self.tables["online_acceptance"].set_index(["strategy", "statistic"])
        speed = self.tables["online_speed"].set_index("strategy")
        lines = []
        for _, r in self.tables["online_strategies"].iterrows():
            d = r["strategy"]
            real = acc.loc[(d, "realized")]
            lines.append(f"{d}: realized {real['mean']:.3f} [{real['low']:.3f}, {real['high']:.3f}], "
                         f"{r['tokens_per_pass']:.2f} tokens/pass, {r['tokens_per_s']:.1f} tokens/s, speed x"
                         f"{speed.loc[d, 'ratio']:.3f} [{speed.loc[d, 'low']:.3f}, {speed.loc[d, 'high']:.3f}]")
        return lines


def strategies_for(names, config: DecodeConfig, reranker=None, source: str = "", compare=()) -> dict:
    """{name: strategy} for the comma list (or sequence) ``names``, the reranker checked against ``config``
    before anything decodes."""
    names = parse_strategies(names if isinstance(names, str) else ",".join(names), STRATEGY_NAMES, "--strategies")
    if not names:
        raise ValueError("--strategies names no strategy")
    wants = "reranked" in names or "reranked" in compare
    if wants and reranker is None:
        raise ValueError("strategy reranked needs --reranker PATH or MLflow model URI (reranker= in Python)")
    if wants and "reranked" not in names:
        raise ValueError("--compare reranked needs reranked in --strategies (its reranker is the one compared)")
    out = {r: make_strategy(r, reranker if r == "reranked" else None, source) for r in names}
    for s in out.values():
        s.check(config)
    return out


@dataclass(frozen=True)
class Protocol:
    """How a comparison decodes and measures: ``warmup`` prompts decoded untimed by every strategy first,
    ``bootstrap`` paired prompt-bootstrap resamples, and the strategies whose drafter runs in a worker process
    (``pipeline``: True for all, or their names) on ``drafter_device`` with ``drafter_threads``."""

    warmup: int = 1
    bootstrap: int = 2000
    pipeline: bool | tuple[str, ...] = False
    drafter_device: str | None = None
    drafter_threads: int | None = None

    def pipelined(self, strategies) -> tuple[str, ...]:
        """The strategies of ``strategies`` that draft in the worker, refusing worker settings without one."""
        names = tuple(strategies) if self.pipeline is True else tuple(self.pipeline or ())
        if (self.drafter_device or self.drafter_threads) and not names:
            raise ValueError("--drafter-device and --drafter-threads place the worker of --pipeline")
        if self.drafter_device:
            parse_device(self.drafter_device)
        return names


@dataclass(frozen=True)
class OnlineSettings:
    """What an online comparison decodes: ``prompts`` (a JSONL file, or a list of ``Prompt``; None: the bundled
    set) with each of ``strategies`` acting in the loop under ``config``; ``compare`` names strategies whose trees
    are also scored at every context, for measurement only; ``protocol`` how it is timed and measured. A reranker
    whose model card lists prompts it learned from is refused on them unless ``allow_training_prompts``."""

    prompts: object = None
    strategies: tuple[str, ...] = ("draft",)
    compare: tuple[str, ...] = ()
    config: DecodeConfig = DecodeConfig(extra=0)
    protocol: Protocol = Protocol()
    allow_training_prompts: bool = False


def compare_online(models: ModelSpec | Models, settings: OnlineSettings = OnlineSettings(), *, reranker=None,
                   reranker_source: str = "", out=None, tracking: Tracking | None = None,
                   progress: bool = True) -> OnlineComparison:
    """Decode ``settings.prompts`` with each of its strategies in the loop, ``reranker`` (a fitted reranker, named
    ``reranker_source``) acting for ``reranked``, and return the tables.

    ``models`` is a ``ModelSpec`` or the ``Models`` already loaded. ``out`` (a folder) receives the tables and
    the acceptance figure, all at once when everything is done. Every input is checked before a model loads.
    Inside a ``kept_worker(models)`` block, pipelined strategies draft in the block's worker.
    """
    prompts, strategies, config, protocol = settings.prompts, settings.strategies, settings.config, settings.protocol
    compare = settings.compare
    if out is not None:
        check_output_dir(out)
    compare = parse_strategies(",".join(compare) if not isinstance(compare, str) else compare)
    acting = strategies_for(strategies, config, reranker, reranker_source, compare)  # a bad reranker fails first
    tracking = tracking.checked() if tracking is not None else None
    prompt_list = prompts if isinstance(prompts, list) else read_prompts(prompts or default_prompts_path())
    if "reranked" in acting:
        check_unseen_prompts(reranker, prompt_list, settings.allow_training_prompts, reranker_source)
    pipelined = protocol.pipelined(acting)
    if isinstance(models, ModelSpec):
        models.check()
    hf_logging.disable_progress_bar()  # weight-loading bars would bury errors and the decode bar
    target, drafter = loaded(models)
    encoded = [(p.prompt_id, p.task, ids) for p, ids in zip(prompt_list, encode_prompts(target, prompt_list, config))]
    started = time.time()  # the MLflow run's start: the decoding's, not its logging's
    with _pipelined(drafter, bool(pipelined), protocol) as worker:
        # disable=None: tqdm stays quiet when stderr is not a terminal (a log file, a pipe, a test)
        with tqdm(total=len(encoded), unit="prompt", desc=f"online B={config.budget} ({len(acting)} strategies each)",
                  disable=None if progress else True, dynamic_ncols=True) as bar:
            rounds, decodes = run_protocol(target, drafter, encoded, config, acting, compare, protocol.warmup,
                                           progress=lambda done, rows: _advance(bar, done, rows),
                                           drafters={name: worker for name in pipelined if name in acting})
    tables = online_tables(rounds, decodes, next(iter(acting)), protocol.bootstrap, config.seed)
    result = OnlineComparison(tables, Path(out) if out is not None else None)
    if out is None and tracking is None:
        return result
    with staged(out) if out is not None else nullcontext() as stage:  # the local outputs appear with MLflow's
        if stage is not None:
            write_online_tables(tables, stage)
        if tracking is not None:
            params = {"reranker": reranker_source, **asdict(protocol)}
            _track(tracking, tables, acting, compare, target, drafter, config, prompts, params, started)
    return result


def _advance(bar, done: int, rows: list[dict]) -> None:
    """The bar at ``done`` prompts, with the rounds so far and the accepted draft tokens a round."""
    rounds, tokens = sum(r["rounds"] for r in rows), sum(r["tokens"] for r in rows)
    bar.set_postfix(rounds=rounds, accepted=f"{(tokens - rounds) / max(rounds, 1):.2f}/round", refresh=False)
    bar.update(done - bar.n)


# The workers kept by the ``kept_worker`` blocks the caller is inside, by drafter (a context variable: a block's
# worker is seen by the comparisons it encloses, in its thread, and by nothing after it)
_KEPT: ContextVar[dict] = ContextVar("kept_workers", default={})


@contextmanager
def _pipelined(drafter, pipeline: bool, protocol: Protocol):
    """The drafter in a worker process when ``pipeline``: the one an enclosing ``kept_worker`` keeps for it, else
    one started on the protocol's device and threads and stopped on exit."""
    if not pipeline:
        yield drafter
    elif (kept := _KEPT.get().get(id(drafter))) is not None:
        yield kept
    else:
        with PipelinedDrafter(drafter, protocol.drafter_device, protocol.drafter_threads) as worker:
            yield worker


@contextmanager
def kept_worker(models: Models, start: bool = True):
    """A worker process for ``models``' drafter that lives for the ``with`` block (when ``start``): every comparison
    of these models decoded inside it that pipelines uses it, instead of starting its own (an interpreter, its
    imports and the drafter's weights each time). Yields the worker, or None."""
    if not start:
        yield None
        return
    with PipelinedDrafter(models.drafter) as worker:
        token = _KEPT.set({**_KEPT.get(), id(models.drafter): worker})
        try:
            yield worker
        finally:
            _KEPT.reset(token)


def _track(tracking: Tracking, tables, acting, compare, target, drafter, config, prompts, params, started) -> None:
    from specrank.experiments.online.online_tracking import log_online  # MLflow: loaded only when tracked

    reranked = acting.get("reranked")
    digest = getattr(getattr(reranked, "reranker", None), "meta_", {}).get("format_digest", "")
    names = ",".join(acting)
    logged = {"stage": "online", "strategies": names, "compare": ",".join(compare), "reranker_format_digest": digest,
              "target": target.name, "target_sha256": target.source_hash, "drafter": drafter.spec,
              "config": asdict(config), "prompts": str(prompts if not isinstance(prompts, list) else
                                                       f"{len(prompts)} prompts"), **params}
    log_online(tracking.uri, tracking.experiment, tracking.run_name or f"online-{names}", logged, tables, started)
