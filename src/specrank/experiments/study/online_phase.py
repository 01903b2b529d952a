"""The study's online phase: draft, the champion, root and root-draw selection decoding unseen prompts in the loop
at each online budget, beside the offline prediction for the same score."""

from __future__ import annotations

from pathlib import Path

from specrank.decode.config import DecodeConfig
from specrank.decode.loading.model_spec import ModelSpec
from specrank.experiments.online.comparison import (
    OnlineComparison,
    OnlineSettings,
    Protocol,
    compare_online,
    kept_worker,
)
from specrank.experiments.study.study_settings import ONLINE_BUDGETS, StudySettings
from specrank.layout import RunLayout
from specrank.rerankers import load_reranker
from specrank.workflow.stages import timed

ONLINE_STRATEGIES = ("draft", "reranked", "root", "root_draw")
GPU_ROUND_MS = 14.5  # an SGLang round of an 8B target on an H200: the round a reranker's cost is weighed against


def online_stage(run_dir: Path, figures: dict, unseen, temp: float, models: ModelSpec, settings: StudySettings, *,
                 goal_prompts: int, other_prompts: int, progress: bool = True) -> dict:
    """Draft, the champion, root and root-draw selection decoded in the loop on ``unseen`` prompts at each of the
    online budgets (``goal_prompts`` of them at B = 8, ``other_prompts`` at the others), each beside the
    offline prediction for the same score; the tables are kept in ``run_dir/online/B<budget>``."""
    run = RunLayout(run_dir)
    champion = load_reranker(run.champion)
    name = figures["champion"]["reranker"]
    loaded = models.load()
    pipelined = ("root_draw",) if loaded.drafter.hidden_layers is None else ()
    out = {"reranker": name, "root_draw_pipelined": bool(pipelined), "budgets": {}}
    folders = {budget: run.online(budget) for budget in settings.online_budgets}
    todo = [b for b, folder in folders.items() if not (folder / "online_speed.parquet").is_file()]
    with kept_worker(loaded, bool(pipelined and todo)):  # one worker for every budget
        for budget, folder in folders.items():
            n = goal_prompts if budget == ONLINE_BUDGETS[0] else other_prompts
            if budget not in todo:
                comparison = OnlineComparison.open(folder)
            else:
                config = DecodeConfig(budget=budget, extra=0, temperature=temp,
                                      max_new_tokens=settings.max_new_tokens, seed=settings.seed)
                with timed(f"online: {n} unseen prompts at T = {temp:g}, B = {budget} -> {folder}"):
                    protocol = Protocol(bootstrap=settings.bootstrap, pipeline=pipelined)
                    online = OnlineSettings(unseen[:n], ONLINE_STRATEGIES, config=config, protocol=protocol)
                    comparison = compare_online(loaded, online, reranker=champion, reranker_source=str(run.champion),
                                                out=folder, progress=progress)
            out["budgets"][str(budget)] = online_figures(comparison, figures["budgets"].get(str(budget)), name,
                                                         n, settings.bootstrap, settings.seed)
    return out


def online_figures(comparison: OnlineComparison, offline: dict | None, champion: str, prompts: int, bootstrap: int,
                   seed: int) -> dict:
    """Per strategy: realized and expected accepted draft tokens a round, the realized gain and tokens/s ratio
    over draft; the offline prediction for the same score (``champion``: the reranked strategy's); the break-even gain on a ``GPU_ROUND_MS`` round."""
    strategies = {}
    per_round = comparison.tables["online_strategies"].set_index("strategy")
    for name in comparison.tables["online_strategies"]["strategy"]:
        entry = {"realized": comparison.realized(name), "expected": comparison.expected(name),
                 "speed": comparison.speed(name)}
        if name != comparison.base:
            entry["realized_gain"] = comparison.realized_gain(name, bootstrap, seed)
        strategies[name] = entry
    figures = {"prompts": prompts, "strategies": strategies}
    if offline is not None:
        offline_score = {"reranked": champion, "root": "root", "draft": "draft"}
        figures["offline"] = {s: offline["scores"][r] for s, r in offline_score.items() if r in offline["scores"]}
    r = per_round.loc["reranked"]
    rerank_ms = 1000.0 * float(r["rerank_s"]) / max(float(r["rounds"]), 1.0)
    draft = strategies["draft"]["realized"][0]
    # A reranker that costs c ms a round pays on a t ms round once it adds (1 + a) c / t accepted tokens a round.
    figures["break_even"] = {"rerank_ms": rerank_ms, "round_ms": GPU_ROUND_MS,
                             "gain": (1.0 + draft) * rerank_ms / GPU_ROUND_MS}
    return figures
