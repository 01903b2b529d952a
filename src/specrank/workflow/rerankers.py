"""Cross-fitting rerankers on a features table: each fold's model, fitted on the other folds' prompts, predicts
that fold (``rerankers.cross_fit``); the held-out predictions and the fold models are saved together."""

from __future__ import annotations

import logging

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from specrank.featurize import features_meta, read_features, write_features
from specrank.featurize.features import META_KEY
from specrank.featurize.sets import input_columns, resolve_features
from specrank.featurize.storage import check_same_rounds, rounds_of
from specrank.layout import RunLayout, rerankers_predictions
from specrank.outputs import check_distinct, check_output_dir, staged
from specrank.rerankers import GBMReranker, load_reranker
from specrank.rerankers.registry import KINDS, kind
from specrank.rerankers import cross_fit_table
from specrank.rerankers import tune
from specrank.schema import FEATURE_KEYS, require_columns
from specrank.workflow.features import Features
from specrank.workflow.tracking import Tracking

log = logging.getLogger(__name__)

GBM_SETTINGS = ("backend", "n_estimators", "learning_rate", "num_leaves", "monotone_draft", "boost_from_draft")


@dataclass
class Rerankers:
    """A folder of cross-fitted rerankers: ``predictions.parquet`` (keys, label, draft and one held-out column
    per reranker) and ``models/NAME-foldF``, the model that predicted fold F. ``fits`` (name -> ``CrossFit``)
    and ``registered`` (the model version ``--register`` registered) belong to the call that fitted them."""

    path: Path
    names: tuple[str, ...]
    fits: dict = field(default_factory=dict, repr=False)
    registered: object | None = None
    logged: dict = field(default_factory=dict)  # "NAME-foldF" -> the logged model's URI
    rows: int = 0  # predictions of the call that fitted them

    @classmethod
    def open(cls, path) -> Rerankers:
        """The rerankers in folder ``path``."""
        path = Path(path)
        if not rerankers_predictions(path).is_file():
            raise FileNotFoundError(f"{path}: no cross-fitted rerankers (no predictions.parquet)")
        folds = sorted((path / "models").glob("*-fold*"))
        names = tuple(dict.fromkeys(p.name.rsplit("-fold", 1)[0] for p in folds))
        return cls(path, names)

    @property
    def predictions_path(self) -> Path:
        return rerankers_predictions(self.path)

    def predictions(self) -> pd.DataFrame:
        return read_features(self.predictions_path)

    def models(self, name: str) -> dict:
        """{fold: the ``name`` model that predicted that fold}, from memory or from disk."""
        if name in self.fits:
            return dict(self.fits[name].models)
        found = sorted((self.path / "models").glob(f"{name}-fold*"))
        if not found:
            raise FileNotFoundError(f"{self.path}: no {name} models")
        return {int(p.name.rsplit("-fold", 1)[1]): load_reranker(p) for p in found}


def make_reranker(name: str, *, seed: int = 0, n_jobs: int | None = None, **gbm):
    """An unfitted reranker of the registered kind ``name`` (``rerankers.registry``); the kinds that boost take
    ``GBMReranker``'s settings (``gbm``)."""
    return kind(name).make(seed=seed, n_jobs=n_jobs, **gbm)


def reranker_names(names) -> list[str]:
    """``names`` (a comma-separated string or a sequence), each a registered kind."""
    text = names if isinstance(names, str) else ",".join(names)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"unknown reranker {text!r} (choose from {', '.join(KINDS)})")
    for name in names:
        kind(name)
    return names


def on_edges(name: str) -> bool:
    """Whether the kind ``name`` is fitted on the pool's edges (per-depth calibration), not the first level."""
    return kind(name).table == "edges"


def cross_fit(features: Features | str | Path, *, rerankers=("isotonic", "base", "rows"), out=None,
              tune_trials: int = 0, seed: int = 0, n_jobs: int | None = None, gbm: dict | None = None,
              tracking: Tracking | None = None, model_prefix: str | None = None, register: str | None = None,
              register_reranker: str | None = None, alias: str = "champion") -> Rerankers:
    """Cross-fit each of ``rerankers`` on ``features`` (per_depth on its edges table) and save them in ``out``
    (default: ``rerankers/`` beside the features); every reranker is fitted before anything is written.

    Base and Rows are tuned with ``tune_trials`` Optuna trials inside each training half. With ``tracking``,
    each fold's held-out metrics, model and study are logged; ``register`` then refits ``register_reranker`` on
    every prompt and registers it under ``alias``. Which reranker is the champion is the study's choice (its
    cross-fitted gain over draft, ``workflow.champion``), not this stage's: the stage registers the one it is told.
    """
    features = features if isinstance(features, Features) else Features(Path(features))
    names = reranker_names(rerankers)
    gbm = dict(gbm or {})
    check_register(register, register_reranker, names, tracking)
    edged = [n for n in names if on_edges(n)]
    if edged and features.edges_path is None:
        raise ValueError(f"{edged[0]} needs --edges (write it with `specrank featurize --edges-out`)")
    for name in names:
        make_reranker(name, seed=seed, n_jobs=n_jobs, **gbm).check_params()  # refused before any work
    out_dir = check_output_dir(out or RunLayout(features.path.parent).rerankers, "--out-dir")
    check_distinct({"--out-dir": out_dir, "--out-dir predictions": rerankers_predictions(out_dir)},
                   {"features": features.path, "--edges": features.edges_path})
    prefix = model_prefix or (tracking.run_name if tracking else None) or features.path.resolve().parent.name
    tracker = None
    if tracking is not None:  # an unreachable store fails here, before any output
        tracker = _tracker(tracking.checked(), prefix)
    feats = features.table()
    edges = features.edges() if edged else None
    check_inputs(names, feats, edges)
    if edges is not None:
        check_same_rounds(f"--edges {features.edges_path}", rounds_of(edges), rounds_of(feats),
                          f"features {features.path} from rounds")
    fitted = Rerankers(out_dir, tuple(names))
    plan = _Plan(prefix, tune_trials, seed, partial(make_reranker, seed=seed, n_jobs=n_jobs, **gbm))
    settings = {**_gbm_settings(gbm), "tune_trials": tune_trials, "n_jobs": n_jobs, "seed": seed}
    tracked = tracker.run(_params(features, feats, names, settings), features.path) if tracker else nullcontext()
    with tracked, staged(out_dir, "--out-dir") as stage:
        fits, preds, edge_preds = _cross_fit_all(names, feats, edges, tracker, plan)
        fitted.fits = fits
        _write_fits(stage, fits, preds, edge_preds, feats, edges)
        if tracker:
            fitted.logged = tracker.log_training(fits, preds, feats, rerankers_predictions(stage))
            if register:
                def refit(name, callbacks):
                    return _refit(name, feats, edges, plan, callbacks)

                fitted.registered = tracker.register(register, refit, alias, register_reranker)
    fitted.rows = len(preds)
    return fitted


def check_register(register: str | None, reranker: str | None, names, tracking: Tracking | None) -> None:
    """Refuse a registration that names no reranker, one not trained here, or no store to register in."""
    if register and not reranker:
        raise ValueError("--register needs --register-reranker NAME: the champion is chosen by its gain over draft "
                         "(`specrank study` registers its own), which training alone does not measure")
    if reranker and reranker not in names:
        raise ValueError(f"--register-reranker {reranker}: not among --rerankers {','.join(names)}")
    if register and tracking is None:
        raise ValueError("--register needs --tracking-uri (the registry lives in the tracking store)")


def _tracker(tracking: Tracking, prefix: str):
    from specrank.tracking.training import TrainingTracker  # MLflow loads only for a tracked stage

    return TrainingTracker(tracking.uri, tracking.experiment, tracking.run_name, prefix)


def _write_fits(stage: Path, fits: dict, preds, edge_preds, feats, edges) -> None:
    """Each fold's model under ``models/``, the held-out predictions (and the edges'), each carrying the digest of
    the rounds it came from: evaluate checks it against the run."""
    for name, fit in fits.items():
        for fold, model in fit.models.items():
            model.save(stage / "models" / f"{name}-fold{fold}")
    preds.attrs = {META_KEY: features_meta(feats)}
    write_features(preds, rerankers_predictions(stage))
    if edge_preds is not None:
        edge_preds.attrs = {META_KEY: features_meta(edges)}
        write_features(edge_preds, stage / "edge_predictions.parquet")


@dataclass(frozen=True)
class _Plan:
    """How every reranker of one call is made and fitted."""

    prefix: str  # of the Optuna studies' names
    tune_trials: int
    seed: int
    make: Callable  # name -> an unfitted reranker


def check_inputs(names, feats, edges) -> None:
    """Refuse a features (or edges) table that lacks a column some reranker or the predictions table reads."""
    needed = FEATURE_KEYS + ["prompt_index", "fold", "q"]
    for name in (n for n in names if kind(n).tuned):
        needed += input_columns(resolve_features(make_reranker(name).features))
    require_columns(feats.columns, list(dict.fromkeys(needed)), "features")
    if edges is not None:
        require_columns(edges.columns, ["prompt_id", "round", "node", "depth", "fold", "q_edge"], "edges")


def _gbm_settings(gbm: dict) -> dict:
    defaults = GBMReranker()
    return {k: gbm.get(k, getattr(defaults, k)) for k in GBM_SETTINGS}


def _params(features: Features, feats, names, settings) -> dict:
    from specrank.tracking.training import train_params  # MLflow loads only for a tracked stage

    return train_params(features.path, feats, names, settings, features.edges_path)


def _fit(name, table, tracker, plan: _Plan):
    """Cross-fit the reranker ``name`` on ``table`` (its trials tracked when tuned)."""
    trials = plan.tune_trials if kind(name).tuned else 0
    hook = tracker.tune_callbacks(name) if tracker and trials else None
    return cross_fit_table(plan.make(name), table, tune_trials=trials, tune_seed=plan.seed, tune_callbacks=hook,
                              tune_study=f"{plan.prefix}-{name}")


def _refit(name, feats, edges, plan: _Plan, callbacks):
    """The registered reranker fitted on every prompt (tuned first on all of them, study ``<prefix>-<name>-all``):
    (model, the table it was fitted on, tuned parameters)."""
    table = edges if on_edges(name) else feats
    model, tuned = plan.make(name), {}
    if plan.tune_trials and kind(name).tuned:
        tuned = tune(model, table, n_trials=plan.tune_trials, seed=plan.seed, callbacks=callbacks,
                     study_name=f"{plan.prefix}-{name}-all")
        model.set_params(**tuned)
    return model.fit(table), table, tuned


def refit(name: str, features, edges=None, *, tune_trials: int = 0, seed: int = 0, n_jobs: int | None = None,
          gbm: dict | None = None, prefix: str = "refit"):
    """The reranker ``name`` fitted on every row of ``features`` (a features table; per_depth: of ``edges``), Base
    and Rows tuned first with ``tune_trials`` Optuna trials on all of them (study ``<prefix>-<name>-all``)."""
    plan = _Plan(prefix, tune_trials, seed, partial(make_reranker, seed=seed, n_jobs=n_jobs, **(gbm or {})))
    return _refit(name, features, edges, plan, None)[0]


def _cross_fit_all(names, feats, edges, tracker, plan: _Plan):
    """{name: CrossFit}, the predictions table (keys, label, draft, one column per name) and the edge
    predictions table (None without per_depth)."""
    keys = FEATURE_KEYS + ["prompt_index", "fold"] + (["label"] if "label" in feats else [])
    preds = feats[keys].assign(draft=feats["q"].to_numpy())
    fits, edge_preds = {}, None
    for name in (n for n in names if not on_edges(n)):
        fits[name] = _fit(name, feats, tracker, plan)
        preds[name] = fits[name].predictions
        log.info(f"{name}: cross-fitted on {len(feats)} rows")
    if edges is not None:
        edge_preds = edges[["prompt_id", "round", "node", "depth", "fold"]].copy()
        at = pd.MultiIndex.from_arrays([preds.prompt_id, preds["round"], preds.cand])
        for name in (n for n in names if on_edges(n)):  # the first level's column: the depth-1 edges' predictions
            fits[name] = _fit(name, edges, tracker, plan)
            edge_preds[name] = fits[name].predictions
            first = edge_preds[edge_preds.depth == 1].set_index(["prompt_id", "round", "node"])[name]
            preds[name] = first.reindex(at).to_numpy()
    return fits, preds, edge_preds
