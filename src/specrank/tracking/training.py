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
from specrank.featurize.sets import input_columns
from specrank.markdown import markdown_table
from specrank.rerankers.tune import study_name
from specrank.tracking.lineage import file_dataset, log_dataset
from specrank.tracking.models import log_reranker, model_name
from specrank.tracking.registry import register_reranker
from specrank.tracking.runs import (
    NOTE_TAG,
    experiment_run,
    file_hash,
    log_metrics,
    log_params,
    nested_run,
    set_description,
)
from specrank.tracking.trials import TrialLogger


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
        "n_candidates": float(len(pred)),
        "n_rounds": float(len(hit)),
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


UNITS = ("`*mse*` is the held-out squared error per first-level candidate of the predicted first factor "
         "(`*_pct_of_draft`: as a percentage of the draft probability's); `*top1_hit_pct` is the percentage of "
         "rounds whose top-predicted candidate has the round's highest label (rounds with an all-zero first "
         "level do not count). Each fold's model is scored on the prompts it never saw.")


LOAD_HINT = "Load it with `specrank.tracking.resolve_reranker(URI, tracking_uri=...)` or `specrank online --reranker URI`."


def fold_note(name: str, fold) -> str:
    return f"The {name} model that predicts fold {fold}, fitted on the other fold's prompts."


class FoldTrials:
    """Optuna callback: each finished trial as a nested run of the (already created) fold run ``run_id``."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.logger = TrialLogger("inner_mse")

    def __call__(self, study, trial) -> None:
        with mlflow.start_run(run_id=self.run_id, nested=True):  # resumes the fold run, parent unchanged
            self.logger(study, trial)


def fold_means(scores: Mapping[tuple[str, str], dict]) -> dict[str, float]:
    """The parent run's metrics from ``{(reranker, fold): fold_metrics}``: per reranker, the fold means of
    held-out MSE (and % of draft's) and top-1 hit rate; the draft's own; the candidates and rounds scored."""
    frame = pd.DataFrame([{"name": n, "fold": f, **m} for (n, f), m in scores.items()])
    first = frame[frame["name"] == frame["name"].iloc[0]]  # the draft's scores and the folds' sizes
    out = {"n_candidates": first["n_candidates"].sum(), "n_rounds": first["n_rounds"].sum(),
           "draft_heldout_mse": first["mse_draft"].mean(), "draft_top1_hit_pct": first["top1_hit_pct_draft"].mean()}
    for name, m in frame.groupby("name", sort=False).mean(numeric_only=True).iterrows():
        out.update({f"{name}_heldout_mse": m["mse"], f"{name}_heldout_mse_pct_of_draft": m["mse_pct_of_draft"],
                    f"{name}_top1_hit_pct": m["top1_hit_pct"]})
    return {k: float(v) for k, v in out.items()}


def training_note(metrics: Mapping[str, float], names) -> str:
    """The parent run's description: rerankers x fold-mean held-out metrics, then the units."""
    rows = [["draft", f"{metrics['draft_heldout_mse']:.5f}", "100.0", f"{metrics['draft_top1_hit_pct']:.1f}"]]
    rows += [[n, f"{metrics[f'{n}_heldout_mse']:.5f}", f"{metrics[f'{n}_heldout_mse_pct_of_draft']:.1f}",
              f"{metrics[f'{n}_top1_hit_pct']:.1f}"] for n in names if f"{n}_heldout_mse" in metrics]
    table = markdown_table(["first factor", "held-out MSE", "% of draft's", "top-1 hit %"], rows)
    return f"Cross-fitted rerankers, means over folds.\n\n{table}\n\n{UNITS}"


class TrainingTracker:
    """Logs one ``specrank train``: ``run(params, features)`` opens the parent run the other methods log into.

    Models and Optuna studies are named ``<model_prefix>-<reranker>-fold<f>``.
    """

    def __init__(self, uri: str, experiment: str = "specrank-train", run_name: str | None = None,
                 model_prefix: str | None = None):
        self.uri, self.experiment, self.run_name, self.model_prefix = uri, experiment, run_name, model_prefix
        self.fold_runs: dict[tuple[str, str], str] = {}
        self.scores: dict[tuple[str, str], dict] = {}
        self.uris: dict[tuple[str, str], str] = {}

    @contextmanager
    def run(self, params: Mapping, features: Path) -> Iterator[mlflow.ActiveRun]:
        """The parent run, with ``params`` and the ``features`` dataset (context ``training``) logged."""
        with experiment_run(self.experiment, run_name=self.run_name, tracking_uri=self.uri,
                            tags={"specrank.stage": "train"}, description="Cross-fitting rerankers.") as parent:
            log_params(params)
            log_dataset(file_dataset(features), "training")
            yield parent

    def fold_run(self, name: str, fold) -> str:
        """Id of the nested run of ``name``'s fold-``fold`` model, created on first use."""
        key = (name, str(fold))
        if key not in self.fold_runs:
            tags = {"specrank.reranker": name, "specrank.fold": str(fold)}
            with nested_run(f"{name}-fold{fold}", tags=tags, description=fold_note(name, fold)) as run:
                self.fold_runs[key] = run.info.run_id
        return self.fold_runs[key]

    def tune_callbacks(self, name: str):
        """``cross_fit``'s per-fold hook: log that fold's Optuna trials under its fold run."""
        return lambda fold: [FoldTrials(self.fold_run(name, fold))]

    def log_training(self, fits: Mapping, preds: pd.DataFrame, example: pd.DataFrame, predictions: Path) -> dict:
        """Each fold's metrics, tuned parameters and model in its run; fold means, the description and
        ``predictions`` in the parent.

        ``fits`` maps reranker names to ``CrossFit`` results, ``preds`` holds one column per name
        (first-level rows, with ``label`` and ``draft``), ``example`` features give the signature.
        Returns ``{"<name>-fold<f>": model URI}``.
        """
        rounds = preds.groupby(["prompt_id", "round"], sort=False, observed=True).ngroup().to_numpy()  # (n,)
        for name, fit in fits.items():
            first = next(iter(fit.models.values()))
            log_params({f"feature_columns.{name}": len(first.features_)})
            for fold, model in fit.models.items():
                held = (preds["fold"] == fold).to_numpy() & np.isfinite(preds[name].to_numpy(dtype=np.float64))
                with mlflow.start_run(run_id=self.fold_run(name, fold), nested=True):
                    inputs = input_columns(model.features_)  # the signature's columns (the prior is read from token)
                    study = {"study": study_name(f"{self.model_prefix}-{name}", fold)} if fold in fit.params else {}
                    log_params({"reranker": name, "fold": str(fold), "features": inputs,
                                "tuned": fit.params.get(fold, {}), **study})
                    h = preds[held]
                    scores = fold_metrics(h[name], h["label"], h["draft"], rounds[held], h["cand"])
                    log_metrics(scores)
                    rows = [[k, f"{v:.5g}"] for k, v in scores.items()]
                    set_description(f"{fold_note(name, fold)}\n\n{markdown_table(['held out', 'value'], rows)}\n\n{UNITS}")
                    key = (name, str(fold))
                    self.scores[key] = scores
                    self.uris[key] = log_reranker(
                        model, model_name(self.model_prefix, name, fold), example, params={"features": ",".join(inputs)},
                        tags={"specrank.reranker": name, "specrank.fold": str(fold), "specrank.run": self.model_prefix or "",
                              NOTE_TAG: f"The {name} reranker of {self.model_prefix} that predicts fold {fold} (fitted "
                                        f"on the other fold's prompts); its metrics are held out. {LOAD_HINT}"})
        metrics = fold_means(self.scores)
        log_metrics(metrics)
        set_description(training_note(metrics, fits))
        log_dataset(file_dataset(predictions), "output")
        mlflow.log_artifact(str(predictions))
        return {f"{n}-fold{f}": uri for (n, f), uri in self.uris.items()}

    def register(self, name: str, alias: str = "champion", reranker: str | None = None):
        """Register the chosen fold model as a new version of ``name`` with ``alias``: ``reranker``'s (default:
        the lowest fold-mean held-out MSE), from the fold where it scored best. Returns the ModelVersion."""
        mean = {n: np.mean([m["mse"] for (k, _), m in self.scores.items() if k == n]) for n, _ in self.scores}
        if reranker is not None and reranker not in mean:
            raise ValueError(f"--register-reranker {reranker}: not among the trained rerankers ({', '.join(mean)})")
        chosen = reranker or min(mean, key=mean.get)
        fold = min((f for n, f in self.scores if n == chosen), key=lambda f: self.scores[(chosen, f)]["mse"])
        s = self.scores[(chosen, fold)]
        note = (f"{chosen} reranker of {self.model_prefix or self.run_name}, the model fitted without fold {fold}'s "
                f"prompts: held-out MSE {s['mse']:.5f} ({s['mse_pct_of_draft']:.1f}% of draft's), top-1 hit "
                f"{s['top1_hit_pct']:.1f}%.")
        tags = {"specrank.reranker": chosen, "specrank.fold": fold, "heldout_mse": f"{s['mse']:.6g}"}
        return register_reranker(self.uris[(chosen, fold)], name, alias, description=note, tags=tags)
