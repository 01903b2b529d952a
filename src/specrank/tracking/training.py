"""``specrank train`` in MLflow: a parent run, one nested run per (reranker, fold) with that fold's
held-out metrics and model, and the Optuna trials of the fold's model nested under its run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from specrank.featurize.features import META_KEY
from specrank.tracking.models import log_reranker
from specrank.tracking.runs import experiment_run, file_hash, log_metrics, log_params, nested_run
from specrank.tracking.trials import TrialLogger
from specrank.tracking.uri import check_reachable, resolve_tracking_uri

DEFAULT = "default"


def training_uri(value: str | None) -> str | None:
    """None (no tracking), or the checked-reachable URI of ``value`` (``"default"``: MLflow's default store)."""
    if value is None:
        return None
    return check_reachable(resolve_tracking_uri(None if value == DEFAULT else value))


def top1_hits(pred, label, rounds, cand) -> tuple[np.ndarray, np.ndarray]:
    """Per round: is the top-predicted candidate one with the round's highest label, and does the round count.

    ``rounds`` codes each row's round. Prediction ties go to the lower ``cand`` (higher draft
    probability); rounds whose labels are all 0 (greedy: argmax outside the first level) do not count.
    """
    order = np.lexsort((cand, -np.asarray(pred, dtype=np.float64), rounds))  # by round, best prediction first
    codes = np.asarray(rounds)[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])  # (R,) first row of each round
    label = np.asarray(label, dtype=np.float64)[order]
    best = np.maximum.reduceat(label, starts)  # (R,)
    return label[starts] == best, best > 0


def fold_metrics(pred, label, draft, rounds, cand) -> dict[str, float]:
    """Held-out squared error per candidate and top-1 hit rate of ``pred``, with the draft ``q`` as reference."""
    pred, label, draft = (np.asarray(a, dtype=np.float64) for a in (pred, label, draft))
    se, se_draft = (pred - label) ** 2, (draft - label) ** 2
    hit, counted = top1_hits(pred, label, rounds, cand)
    hit_draft, _ = top1_hits(draft, label, rounds, cand)
    n_counted = max(int(counted.sum()), 1)
    return {
        "rows": float(len(pred)),
        "rounds": float(len(hit)),
        "mse": float(se.mean()),
        "mse_draft": float(se_draft.mean()),
        "mse_pct_of_draft": 100.0 * float(se.sum() / se_draft.sum()) if se_draft.sum() > 0 else float("nan"),
        "top1_hit_pct": 100.0 * float(hit[counted].sum()) / n_counted,
        "top1_hit_pct_draft": 100.0 * float(hit_draft[counted].sum()) / n_counted,
    }


def train_params(features: Path, feats: pd.DataFrame, names, settings: Mapping, edges: Path | None = None) -> dict:
    """Parent-run parameters: inputs and their SHA-256, pool shape and labels, rerankers and their settings."""
    meta = feats.attrs.get(META_KEY, {})
    pool = {k: meta[k] for k in ("label_kind", "topk", "temperature", "version") if k in meta}
    pool.update(rows=len(feats), rounds=len(feats.drop_duplicates(["prompt_id", "round"])),
                prompts=int(feats["prompt_id"].nunique()))
    params = {"stage": "train", "features": str(features.resolve()), "features_sha256": file_hash(features),
              "pool": pool, "rerankers": list(names), "settings": dict(settings)}
    if edges is not None:
        params.update(edges=str(edges.resolve()), edges_sha256=file_hash(edges))
    return params


class FoldTrials:
    """Optuna callback: each finished trial as a nested run of the (already created) fold run ``run_id``."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.logger = TrialLogger("inner_mse")

    def __call__(self, study, trial) -> None:
        with mlflow.start_run(run_id=self.run_id, nested=True):  # resumes the fold run, parent unchanged
            self.logger(study, trial)


class TrainingTracker:
    """Logs one ``specrank train``: ``run(params)`` opens the parent run the other methods log into."""

    def __init__(self, uri: str, experiment: str = "specrank-train", run_name: str | None = None):
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        self.fold_runs: dict[tuple[str, str], str] = {}

    @contextmanager
    def run(self, params: Mapping) -> Iterator[mlflow.ActiveRun]:
        """The parent run, with ``params`` logged."""
        with experiment_run(self.experiment, run_name=self.run_name, tracking_uri=self.uri) as parent:
            log_params(params)
            yield parent

    def fold_run(self, name: str, fold) -> str:
        """Id of the nested run of ``name``'s fold-``fold`` model, created on first use."""
        key = (name, str(fold))
        if key not in self.fold_runs:
            tags = {"specrank.reranker": name, "specrank.fold": str(fold)}
            with nested_run(f"{name}-fold{fold}", tags=tags) as run:
                self.fold_runs[key] = run.info.run_id
        return self.fold_runs[key]

    def tune_callbacks(self, name: str):
        """``cross_fit``'s per-fold hook: log that fold's Optuna trials under its fold run."""
        return lambda fold: [FoldTrials(self.fold_run(name, fold))]

    def log_training(self, fits: Mapping, preds: pd.DataFrame, example: pd.DataFrame, predictions: Path) -> dict:
        """Each fold's metrics, tuned parameters and model in its run; ``predictions`` in the parent.

        ``fits`` maps reranker names to ``CrossFit`` results, ``preds`` holds one column per name
        (first-level rows, with ``label`` and ``draft``), ``example`` features give the signature.
        Returns ``{"<name>-fold<f>": model URI}``.
        """
        rounds = preds.groupby(["prompt_id", "round"], sort=False, observed=True).ngroup().to_numpy()  # (n,)
        uris = {}
        for name, fit in fits.items():
            first = next(iter(fit.models.values()))
            log_params({f"feature_columns.{name}": len(first.features_)})
            for fold, model in fit.models.items():
                held = (preds["fold"] == fold).to_numpy() & np.isfinite(preds[name].to_numpy(dtype=np.float64))
                with mlflow.start_run(run_id=self.fold_run(name, fold), nested=True):
                    log_params({"reranker": name, "fold": str(fold), "features": list(model.features_),
                                "tuned": fit.params.get(fold, {})})
                    h = preds[held]
                    log_metrics(fold_metrics(h[name], h["label"], h["draft"], rounds[held], h["cand"]))
                    uris[f"{name}-fold{fold}"] = log_reranker(model, name, example)
        mlflow.log_artifact(str(predictions))
        return uris
