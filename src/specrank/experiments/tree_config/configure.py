"""Serving-engine tree settings measured with a target and a drafter (``specrank tree-config``,
docs/tree-config.md): one recording per planned pool, every setting scored exactly on its recording
(``experiments.tree_config.setting_scores``), the cost model timed on the models' device, and the outputs written.

Recordings go to ``OUT/recordings`` directly, not through a stage: a run stopped midway keeps its finished
shards, and the same call resumes them (``record_run`` refuses a recording of another configuration).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from specrank import schema
from specrank.atomic import atomic_write, write_parquet_atomic
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.decoder import Decoder
from specrank.decode.loading.drafters import head_directory
from specrank.decode.loading.eagle3_export import export_head
from specrank.decode.loading.model_spec import Models, ModelSpec, loaded
from specrank.decode.prompts import encode_prompts, read_prompts
from specrank.decode.runs.cost import cost_parts, measure_cost
from specrank.decode.runs.manifest import config_manifest
from specrank.decode.runs.shards import check_same_run
from specrank.decode.strategies.static_tree import StaticTreeSelection
from specrank.engines.tree_settings import TreeSetting
from specrank.engines.vllm.token_trees import engine_rounds
from specrank.evaluation.data import align_predictions
from specrank.experiments.tree_config.chain_choice import (
    ChainChoice,
    chain_values,
    choice_seconds,
    choice_table,
    cost_settings,
    score_choice,
)
from specrank.experiments.tree_config.engine_timing import (
    EngineTiming,
    engine_round_seconds,
    extra_widths,
    with_engine_speed,
)
from specrank.experiments.tree_config.recording_plan import recording_plan
from specrank.experiments.tree_config.setting_figures import reliability_figure, tree_config_figure
from specrank.experiments.tree_config.setting_scores import PluginFactors, score_setting
from specrank.experiments.tree_config.setting_table import (
    pooled_reliability,
    position_table,
    reliability_table,
    setting_table,
    tree_config_summary,
)
from specrank.featurize.engine import engine_visible
from specrank.featurize.storage import featurize_run
from specrank.law import Law
from specrank.rerankers import GBMReranker
from specrank.rerankers.crossfit import cross_fit_table
from specrank.workflow.recording import record, recorded_rounds

CROSS_FIT = "cross-fit"
HEAD_FORMATS = ("sglang", "vllm")  # the engines the head is exported for
RECORDING_SHARD = 4  # prompts a recording shard holds


@dataclass(frozen=True)
class TreeConfigSettings:
    """What a tree-config run scores and how it decodes: the engine tree settings ``trees`` (``engines``' tree
    models), every recording decoding every prompt of ``prompts_path`` under one law, length and seed.
    ``reranker``: 'cross-fit' (a rows GBM cross-fitted on each recording by prompt halves), 'none', or the name of
    a loaded reranker (given to ``tree_config`` apart)."""

    prompts_path: str
    temperature: float = 0.0
    max_new_tokens: int = 48
    seed: int = 0
    reranker: str = CROSS_FIT
    repeats: int = 5
    bootstrap: int = 2000
    progress: bool = True
    engine_timing: EngineTiming | None = None  # an engine's measured steps: its speed predicted beside ours
    chain_choices: tuple[ChainChoice, ...] = ()  # vLLM chains whose first token specrank chooses
    plugin_ms: float = 1.0  # the plugin's cost a step, added to a reranker's chain choice
    limit: int | None = None  # the first prompts of ``prompts_path`` (None: all)
    allow_training_prompts: bool = False  # a head decodes prompts it was trained on only when asked
    trees: tuple = ()  # the settings scored (TreeSetting, StaticTreeSetting), in ``setting_order``

    def config(self, rec=None) -> DecodeConfig:
        """The decode configuration of a planned recording (a one-node pool for None)."""
        shape = PoolShape(1, 1, 1) if rec is None else PoolShape(rec.topk, rec.depth, rec.expand)
        return DecodeConfig(shape, 1 if rec is None else rec.budget, 0, self.temperature, self.max_new_tokens,
                            self.seed)

    def choice_config(self, choice: ChainChoice) -> DecodeConfig:
        """The decode configuration of a chain choice's fan: its chains drafted, the drafter's own verified."""
        return DecodeConfig(PoolShape(*choice.fan_shape), choice.num_speculative_tokens, 0, self.temperature,
                            self.max_new_tokens, self.seed)

    def bar(self, **kwargs) -> tqdm:
        # disable=None: tqdm stays quiet when stderr is not a terminal (a log file, a pipe, a test)
        return tqdm(disable=None if self.progress else True, dynamic_ncols=True, **kwargs)


def check_recordings(out, run: TreeConfigSettings) -> None:
    """Before any model loads: a recording already in ``out`` (a run being resumed) must be of this run's pool,
    budget, law, seed and prompts (the models' hashes are compared once they are loaded)."""
    configs = [(name, run.config(rec)) for name, rec in recording_plan(run.trees).items()]
    configs += [(c.recording, run.choice_config(c)) for c in run.chain_choices]
    for name, config in configs:
        check_same_run(Path(out) / "recordings" / name,
                       config_manifest(config, run.prompts_path, RECORDING_SHARD), partial=True)


def record_pool(target, drafter, run: TreeConfigSettings, config: DecodeConfig, run_dir: Path, strategy=None) -> Path:
    """One recording of a planned pool through the workflow's record stage: every prompt under the same seed,
    every pool edge scored, each round verifying ``strategy``'s tree (default: draft selection's)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    record(Models(target, drafter), run.prompts_path, out=run_dir, config=config, limit=run.limit,
           shard_size=RECORDING_SHARD, strategy=strategy, allow_training_prompts=run.allow_training_prompts,
           progress=run.progress)
    return run_dir


def first_factor(rounds, run_dir, run: TreeConfigSettings, reranker=None):
    """(N, topk) first-factor predictions of the compared reranker on this recording, or None, and a note."""
    if run.reranker == "none":
        return None, "none"
    if rounds.topk == 1:
        return None, "none: a chain has one first-level candidate, nothing to rerank"
    if len(np.unique(rounds.prompt_id)) < 2:
        return None, "skipped: cross-fitting needs two prompts"
    features = featurize_run(run_dir)
    if reranker is None:
        model = GBMReranker(features="rows", n_estimators=100, num_leaves=15, min_child_samples=10, n_jobs=1)
        predictions, note = cross_fit_table(model, features).predictions, "rows GBM cross-fitted by prompt halves"
    elif int(getattr(reranker, "topk_", -1)) != rounds.topk:
        return None, f"skipped: the reranker was trained on topk {getattr(reranker, 'topk_', '?')} pools"
    else:
        predictions, note = reranker.predict_first_factor(features), run.reranker
    frame = pd.DataFrame({**{k: features[k] for k in schema.FEATURE_KEYS}, "reranked": np.asarray(predictions)})
    return align_predictions(rounds, frame)["reranked"], note


def plugin_factors(rounds, run_dir, run: TreeConfigSettings, reranker=None) -> PluginFactors | None:
    """SGLang's plugin on this recording (``PluginFactors``): first factors predicted from the features the plugin
    computes (``featurize.engine``: no prompt rows, task unknown), by the given reranker or a rows GBM cross-fitted
    on those features, and a stacked reranker's per-depth maps. None where ``first_factor`` scores no reranker."""
    if run.reranker == "none" or rounds.topk == 1 or len(np.unique(rounds.prompt_id)) < 2:
        return None
    if reranker is not None and int(getattr(reranker, "topk_", -1)) != rounds.topk:
        return None
    features = engine_visible(featurize_run(run_dir))
    if reranker is None:
        model = GBMReranker(features="rows", n_estimators=100, num_leaves=15, min_child_samples=10, n_jobs=1)
        predictions, deeper = cross_fit_table(model, features).predictions, None
    else:
        predictions = reranker.predict_first_factor(features)
        deeper = getattr(reranker, "predict_deeper_factors", None)
    frame = pd.DataFrame({**{k: features[k] for k in schema.FEATURE_KEYS}, "plugin": np.asarray(predictions)})
    return PluginFactors(np.asarray(align_predictions(rounds, frame)["plugin"]), deeper)


def choice_factors(rounds, run_dir, run: TreeConfigSettings, choice: ChainChoice, reranker=None):
    """(first factors (N, K), ranking scores (N, K) or None, note) of a fan's rounds, from the features a chain
    engine has at its first draft step (``FIRST_STEP``, as the engine sees them): a pointwise GBM and a LambdaRank
    GBM (relevance: the chain's exact expected accepted tokens through each first token over k), both
    cross-fitted by prompt halves; or the given reranker's first factors (no ranking)."""
    if len(np.unique(rounds.prompt_id)) < 2:
        return None, None, "skipped: cross-fitting needs two prompts"
    features = engine_visible(featurize_run(run_dir))
    keys = pd.DataFrame({k: features[k] for k in schema.FEATURE_KEYS})
    if reranker is not None:
        if int(getattr(reranker, "topk_", -1)) != rounds.topk:
            return None, None, f"skipped: the reranker was trained on topk {getattr(reranker, 'topk_', '?')} pools"
        first = align_predictions(rounds, keys.assign(r=np.asarray(reranker.predict_first_factor(features))))
        return first["r"], None, run.reranker
    k = choice.num_speculative_tokens
    params = dict(features="first_step", n_estimators=100, num_leaves=15, min_child_samples=10, n_jobs=1)
    values, _ = chain_values(rounds.pool, rounds.law, k)  # (N, K), rounds' order
    row = pd.MultiIndex.from_arrays([rounds.prompt_id, rounds.round]).get_indexer(
        pd.MultiIndex.from_arrays([keys["prompt_id"].astype(str).to_numpy(), keys["round"].to_numpy()]))
    relevance = values[row, keys["cand"].to_numpy(dtype=np.int64)] / k
    pointwise = cross_fit_table(GBMReranker(**params), features).predictions
    ranked = cross_fit_table(GBMReranker(objective="lambdarank", **params), features, relevance).predictions
    aligned = align_predictions(rounds, keys.assign(r=np.asarray(pointwise), s=np.asarray(ranked)))
    return aligned["r"], aligned["s"], "first-step GBM and LambdaRank GBM cross-fitted by prompt halves"


def chain_choices(target, drafter, prompts, run: TreeConfigSettings, out, reranker=None, say=None):
    """Record each chain choice's fan into ``out/recordings`` and score every rule: ([ChoiceScore], notes)."""
    scores, notes = [], {}
    for choice in run.chain_choices:
        if say is not None:
            say(f"recording {choice.recording}: {len(prompts)} prompts, {run.max_new_tokens} tokens each")
        run_dir = record_pool(target, drafter, run, run.choice_config(choice),
                              Path(out) / "recordings" / choice.recording, StaticTreeSelection(choice.chain))
        rounds = recorded_rounds(run_dir)
        first, ranking, note = choice_factors(rounds, run_dir, run, choice, reranker)
        kept = np.asarray(rounds.round) > 0  # the rounds an engine drafts (``engine_rounds``)
        first = None if first is None else np.asarray(first)[kept]
        ranking = None if ranking is None else np.asarray(ranking)[kept]
        scores.append(score_choice(choice, engine_rounds(rounds), rounds.law, first, ranking))
        notes[choice.recording] = {"rounds": rounds.n_rounds, "reranker": note}
    return scores, notes


def host_seconds(target, drafter, prompt_ids, settings, cost, run: TreeConfigSettings) -> float:
    """Host seconds per round: an online decode's round time beyond its timed pool and pass (one middle setting)."""
    beams = [s for s in settings if isinstance(s, TreeSetting)]  # the grid always holds beams; a static tree's
    s = beams[len(beams) // 2]  # host work is the same bookkeeping
    dec = Decoder(target, drafter, "draft", budget=s.budget, shape=PoolShape(*s.draft_shape))
    dec.generate(prompt_ids, max_new_tokens=8, temperature=run.temperature, seed=run.seed)  # warm-up
    stats = dec.generate(prompt_ids, max_new_tokens=min(32, run.max_new_tokens), temperature=run.temperature,
                         seed=run.seed).stats
    per_round = (stats.seconds - stats.time_split.get("prefill", 0.0)) / max(stats.rounds, 1)
    return max(0.0, per_round - cost.draft[s.draft_shape] - cost.verify[s.num_draft_tokens])


def export_heads(spec: str, out: Path) -> dict:
    """The EAGLE-3 head exported for SGLang and vLLM (``drafter export``), or {} for other drafters."""
    head = head_directory(spec)
    if head is None:
        return {}
    return {fmt: str(export_head(head, out / fmt, fmt, "bf16")[0]) for fmt in HEAD_FORMATS}


@dataclass(frozen=True)
class TreeConfigResult:
    """A tree-config run's tables (``table``: one row per setting, ranked; ``positions``, ``reliability``,
    ``cost``; ``choices``: the chain choices, or None), its recordings' notes, the law, the run's ``out`` and the
    models it ran (``models``: target, its digest, the drafter's spec)."""

    table: pd.DataFrame = field(repr=False)
    positions: pd.DataFrame = field(repr=False)
    reliability: pd.DataFrame = field(repr=False)
    cost: pd.DataFrame = field(repr=False)
    recordings: dict
    choices: pd.DataFrame | None = field(repr=False)
    law: str
    out: Path
    models: dict

    @property
    def has_head(self) -> bool:
        return head_directory(self.models["drafter"]) is not None

    def summary(self) -> dict:
        """``tree_config_summary``: the best settings, the flags naming the heads at their place in ``out``."""
        heads = {fmt: str(self.out / "heads" / fmt) for fmt in HEAD_FORMATS} if self.has_head else {}
        return tree_config_summary(self.table, self.law, self.recordings, heads)

    def figures(self) -> dict:
        return {"tree_config": tree_config_figure(self.table), "reliability": reliability_figure(self.reliability)}

    def write(self, folder) -> None:
        """The tables (Parquet, the ranked one also CSV), the figures, ``summary.json`` and the head exported for
        the engines (``heads/``) in ``folder`` (each atomic)."""
        folder = Path(folder)
        for name in ("table", "positions", "reliability", "cost"):
            write_parquet_atomic(getattr(self, name), folder / f"tree_config_{name}.parquet")
        atomic_write(folder / "tree_config_table.csv", lambda tmp: self.table.to_csv(tmp, index=False))
        if self.choices is not None and len(self.choices):
            write_parquet_atomic(self.choices, folder / "tree_config_choices.parquet")
            atomic_write(folder / "tree_config_choices.csv", lambda tmp: self.choices.to_csv(tmp, index=False))
        for name, fig in self.figures().items():
            atomic_write(folder / f"{name}.png", lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120))
        text = json.dumps(self.summary(), indent=2, default=str)
        atomic_write(folder / "summary.json", lambda tmp: Path(tmp).write_text(text))
        export_heads(self.models["drafter"], folder / "heads")


def tree_config(models: ModelSpec | Models, settings: TreeConfigSettings, *, out, reranker=None,
                say: Callable[[str], None] | None = None) -> TreeConfigResult:
    """Record the pools ``settings.trees`` needs into ``out/recordings`` (resumed when there), score every setting
    and time the cost model; the result writes its tables, figures and the exported head (``TreeConfigResult.write``).
    ``say(line)`` announces each recording. A bar per stage: each recording (prompts, rounds, accepted tokens a
    round), its scoring, the timed passes."""
    check_recordings(out, settings)
    target, drafter = loaded(models)
    run, trees = settings, settings.trees  # how it decodes; the tree settings it scores
    prompts = read_prompts(run.prompts_path, limit=run.limit)
    recordings, scores, reliability = {}, [], []
    for name, rec in recording_plan(trees).items():
        if say is not None:
            say(f"recording {name}: {len(prompts)} prompts, {run.max_new_tokens} tokens each")
        run_dir = record_pool(target, drafter, run, run.config(rec), Path(out) / "recordings" / name)
        rounds = recorded_rounds(run_dir)
        with run.bar(total=len(rec.settings) + 1, desc=f"scoring {name}", unit="setting") as bar:
            factor, note = first_factor(rounds, run_dir, run, reranker)
            plugin = plugin_factors(rounds, run_dir, run, reranker)
            bar.update()
            recordings[name] = {"topk": rec.topk, "depth": rec.depth, "expand": rec.expand, "budget": rec.budget,
                                "rounds": rounds.n_rounds, "reranker": note}
            # the rounds an engine drafts: each prompt's first round, which drafts the first output token, has no
            # counterpart in an engine, whose prefill emits that token (docs/tree-config.md, "Checked against vLLM")
            kept = np.asarray(rounds.round) > 0
            pool, factor = engine_rounds(rounds), None if factor is None else np.asarray(factor)[kept]
            plugin = None if plugin is None else PluginFactors(plugin.first[kept], plugin.deeper)
            for s in rec.settings:
                scores.append(score_setting(pool, rounds.law, s, factor, name, plugin))
                bar.update()
        reliability.append(reliability_table(rounds.pool, rounds.law).assign(recording=name))
    choices, notes = chain_choices(target, drafter, prompts, run, out, reranker, say)
    recordings.update(notes)
    config_ids = encode_prompts(target, prompts[:1], run.config())[0]
    extra = extra_widths(run.engine_timing)
    timed = list(trees) + [c for choice in run.chain_choices for c in cost_settings(choice)]
    parts = sum(map(len, cost_parts(timed, extra)))
    with run.bar(total=parts, desc="timing pools and passes", unit="part") as bar:
        cost = measure_cost(target, drafter, config_ids, timed, run.repeats, done=bar.update, widths=extra)
    cost.host = host_seconds(target, drafter, config_ids, trees, cost, run)
    table = setting_table(scores, {s.label: cost.round_seconds(s) for s in trees}, run.bootstrap, run.seed)
    engine = None
    if run.engine_timing is not None:
        timing = run.engine_timing
        engine = engine_round_seconds(timing, cost, trees)
        table = with_engine_speed(table, engine, timing)
    return TreeConfigResult(table, position_table(scores), pooled_reliability(reliability), pd.DataFrame(cost.rows()),
                            recordings, choice_speeds(choices, cost, run, table, engine) if choices else None,
                            Law(run.temperature).name, Path(out),
                            {"target": target.name, "target_sha256": target.source_hash, "drafter": drafter.spec})


def choice_speeds(scores, cost, run: TreeConfigSettings, table: pd.DataFrame, engine: dict | None) -> pd.DataFrame:
    """The chain choices' table with specrank's predicted tokens/s and, where an engine was timed, the engine's
    (its step for vLLM's chain of k, plus the plugin's cost and the m chains' extra drafting as specrank times it)."""
    plugin = run.plugin_ms / 1000
    seconds = {}
    for s in scores:
        c = s.choice
        verify = cost.verify[c.num_speculative_tokens + 1] + cost.host
        seconds |= choice_seconds(c, cost.draft, verify, plugin)
    out = choice_table(scores, seconds, run.bootstrap, run.seed)
    if engine is None:
        return out
    steps = {}
    for s in scores:
        c, label = s.choice, f"k1-s{s.choice.num_speculative_tokens}-n{s.choice.num_speculative_tokens + 1}"
        if label not in engine:
            continue
        one, many = cost_settings(c)
        steps |= choice_seconds(c, {one.draft_shape: 0.0, many.draft_shape: cost.draft[many.draft_shape]
                                    - cost.draft[one.draft_shape]}, engine[label], plugin)
    rs = pd.Series([steps.get((r.choice, r.rule), np.nan) for r in out.itertuples()], index=out.index)
    out["engine_round_seconds"] = rs
    for suffix in ("", "_low", "_high"):
        out[f"engine_tokens_per_s{suffix}"] = out[f"length{suffix}"] / rs
    base = out[out["rule"] == "draft"].set_index("choice")["engine_tokens_per_s"]
    out["engine_speed_over_draft"] = out["engine_tokens_per_s"] / out["choice"].map(base)
    return out
