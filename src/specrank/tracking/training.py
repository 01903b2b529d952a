"""``specrank train`` in MLflow: a parent run, one nested run per (reranker, fold) with that fold's
held-out metrics, model and Optuna study (trials table, history figure), timed as the fold's fit; the
candidates table, and the registered champion refitted on every prompt in a nested run of its own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from specrank.featurize.features import META_KEY
from specrank.markdown import markdown_table
from specrank.tracking.lineage import file_dataset, log_dataset
from specrank.tracking.models import log_reranker, model_name, signature_columns
from specrank.tracking.registry import register_reranker
from specrank.tracking.runs import (
    NOTE_TAG,
    experiment_run,
    file_hash,
    log_metrics,
    log_params,
    log_tables,
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
    """Held-out squared error per candidate and top-1 hit rate of ``pred``, with the draft ``q`` as reference.

    The keys are the same whichever reranker ``pred`` comes from (the reranker is its run's tag and param), so
    one MLflow chart of ``heldout_mse`` compares the rerankers' fold runs.
    """
    pred, label, draft = (np.asarray(a, dtype=np.float64) for a in (pred, label, draft))
    se, se_draft = (pred - label) ** 2, (draft - label) ** 2
    hit, counted = top1_hits(pred, label, rounds, cand)
    hit_draft, _ = top1_hits(draft, label, rounds, cand)
    n_counted = max(int(counted.sum()), 1)
    return {
        "n_candidates": float(len(pred)),
        "n_rounds": float(len(hit)),
        "heldout_mse": float(se.mean()),
        "draft_heldout_mse": float(se_draft.mean()),
        "heldout_mse_pct_of_draft": 100.0 * float(se.sum() / se_draft.sum()) if se_draft.sum() > 0 else float("nan"),
        "top1_best_label_pct": 100.0 * float(hit[counted].sum()) / n_counted,
        "draft_top1_best_label_pct": 100.0 * float(hit_draft[counted].sum()) / n_counted,
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


UNITS = ("`*heldout_mse` is the held-out squared error per first-level candidate of the predicted first factor "
         "(`*_pct_of_draft`: as a percentage of the draft probability's; `draft_*` the draft probability's own); "
         "`*top1_best_label_pct` is the percentage "
         "of rounds whose top-predicted candidate has the round's highest label (rounds with an all-zero first "
         "level do not count; the evaluation's `*_top1_argmax_pct` counts every round against the target's "
         "argmax instead). Each fold's model is scored on the prompts it never saw; `wall_s` is a run's seconds.")


LOAD_HINT = "Load it with `specrank.tracking.resolve_reranker(URI, tracking_uri=...)` or `specrank online --reranker URI`."


def fold_note(name: str, fold) -> str:
    return f"The {name} model that predicts fold {fold}, fitted on the other fold's prompts."


def fold_means(scores: Mapping[tuple[str, str], dict]) -> dict[str, float]:
    """Fold means from ``{(reranker, fold): fold_metrics}``: per reranker, held-out MSE (and % of draft's) and
    top-1 hit rate (``<reranker>_heldout_mse``, ...); the draft's own; the candidates and rounds scored. Only
    ``shared_metrics`` of them are the parent run's metrics: a reranker's are its fold runs'."""
    frame = pd.DataFrame([{"name": n, "fold": f, **m} for (n, f), m in scores.items()])
    first = frame[frame["name"] == frame["name"].iloc[0]]  # the draft's scores and the folds' sizes
    out = {"n_candidates": first["n_candidates"].sum(), "n_rounds": first["n_rounds"].sum(),
           "draft_heldout_mse": first["draft_heldout_mse"].mean(),
           "draft_top1_best_label_pct": first["draft_top1_best_label_pct"].mean()}
    for name, m in frame.groupby("name", sort=False).mean(numeric_only=True).iterrows():
        out.update({f"{name}_heldout_mse": m["heldout_mse"],
                    f"{name}_heldout_mse_pct_of_draft": m["heldout_mse_pct_of_draft"],
                    f"{name}_top1_best_label_pct": m["top1_best_label_pct"]})
    return {k: float(v) for k, v in out.items()}


def shared_metrics(means: Mapping[str, float], names) -> dict[str, float]:
    """``fold_means`` without the per-reranker keys: the metrics every train run has under the same names."""
    own = tuple(f"{n}_" for n in names)
    return {k: v for k, v in means.items() if not k.startswith(own)}


def training_note(metrics: Mapping[str, float], names) -> str:
    """The parent run's description: rerankers x fold-mean held-out metrics, then the units."""
    rows = [["draft", f"{metrics['draft_heldout_mse']:.5f}", "100.0", f"{metrics['draft_top1_best_label_pct']:.1f}"]]
    rows += [[n, f"{metrics[f'{n}_heldout_mse']:.5f}", f"{metrics[f'{n}_heldout_mse_pct_of_draft']:.1f}",
              f"{metrics[f'{n}_top1_best_label_pct']:.1f}"] for n in names if f"{n}_heldout_mse" in metrics]
    table = markdown_table(["first factor", "held-out MSE", "% of draft's", "top-1 best-label %"], rows)
    return f"Cross-fitted rerankers, means over folds.\n\n{table}\n\n{UNITS}"


def candidates_table(scores: Mapping[tuple[str, str], dict], uris: Mapping[tuple[str, str], str]) -> pd.DataFrame:
    """One row per reranker: each fold's held-out MSE and model URI, and their mean."""
    rows = {}
    for (name, fold), m in scores.items():
        row = rows.setdefault(name, {"reranker": name})
        row[f"heldout_mse_fold{fold}"] = m["heldout_mse"]
        row[f"model_fold{fold}"] = uris.get((name, fold), "")
    frame = pd.DataFrame(list(rows.values()))
    frame["heldout_mse"] = frame.filter(like="heldout_mse_fold").mean(axis=1)
    return frame.sort_values("heldout_mse", kind="stable").reset_index(drop=True)


def champion_note(chosen: str, candidates: pd.DataFrame, uri: str, rows: int, prompts: int) -> str:
    """A registered version's description: which reranker, the candidates' held-out errors, how to load it."""
    table = markdown_table(["reranker", "held-out MSE (fold mean)"] + [c for c in candidates if c.startswith("heldout_mse_")],
                           [[r["reranker"], f"{r['heldout_mse']:.6f}"] + [f"{r[c]:.6f}" for c in candidates
                                                                        if c.startswith("heldout_mse_")]
                            for _, r in candidates.iterrows()])
    return (f"The {chosen} reranker, registered by `--register-reranker {chosen}`, refitted on all {prompts} prompts "
            f"({rows} rows); the fold models stay for the evaluation. The cross-fitted candidates:\n\n"
            f"{table.replace('heldout_mse_', '')}\n\nLoad it: `{uri}` (`specrank.tracking.resolve_reranker(\"{uri}\", "
            f"tracking_uri=...)` or `specrank online --reranker {uri}`).")


class TrainingTracker:
    """Logs one ``specrank train``: ``run(params, features)`` opens the parent run the other methods log into.

    Models and Optuna studies are named ``<model_prefix>-<reranker>-fold<f>``; each fold's study is a table
    and a figure in that fold's run.
    """

    def __init__(self, uri: str, experiment: str = "specrank-train", run_name: str | None = None,
                 model_prefix: str | None = None):
        self.uri, self.experiment, self.run_name, self.model_prefix = uri, experiment, run_name, model_prefix
        self.trials: dict[tuple[str, str], TrialLogger] = {}
        self.scores: dict[tuple[str, str], dict] = {}
        self.uris: dict[tuple[str, str], str] = {}
        self.example: pd.DataFrame | None = None

    @contextmanager
    def run(self, params: Mapping, features: Path) -> Iterator[mlflow.ActiveRun]:
        """The parent run, with ``params`` and the ``features`` dataset (context ``training``) logged."""
        with experiment_run(self.experiment, run_name=self.run_name, tracking_uri=self.uri,
                            tags={"specrank.stage": "train"}, description="Cross-fitting rerankers.") as parent:
            log_params(params)
            log_dataset(file_dataset(features), "training")
            yield parent

    def tune_callbacks(self, name: str):
        """``cross_fit``'s per-fold hook: keep that fold's Optuna trials for its run."""
        def hook(fold):
            self.trials[(name, str(fold))] = TrialLogger("inner_mse")
            return [self.trials[(name, str(fold))]]
        return hook

    def log_training(self, fits: Mapping, preds: pd.DataFrame, example: pd.DataFrame, predictions: Path) -> dict:
        """One run per (reranker, fold), timed as its fit was, with its held-out metrics, tuned parameters,
        study and model; fold means, the candidates table, the description and ``predictions`` in the parent.

        ``fits`` maps reranker names to ``CrossFit`` results, ``preds`` holds one column per name
        (first-level rows, with ``label`` and ``draft``), ``example`` features give the signature.
        Returns ``{"<name>-fold<f>": model URI}``.
        """
        self.example = example
        rounds = preds.groupby(["prompt_id", "round"], sort=False, observed=True).ngroup().to_numpy()  # (n,)
        for name, fit in fits.items():
            first = next(iter(fit.models.values()))
            log_params({f"feature_columns.{name}": len(first.features_)})
            for fold, model in fit.models.items():
                held = (preds["fold"] == fold).to_numpy() & np.isfinite(preds[name].to_numpy(dtype=np.float64))
                h = preds[held]
                scores = fold_metrics(h[name], h["label"], h["draft"], rounds[held], h["cand"])
                rows = [[k, f"{v:.5g}"] for k, v in scores.items()]
                note = f"{fold_note(name, fold)}\n\n{markdown_table(['held out', 'value'], rows)}\n\n{UNITS}"
                tags = {"specrank.reranker": name, "specrank.fold": str(fold), "specrank.run": self.model_prefix or ""}
                with nested_run(f"{name}-fold{fold}", tags=tags, description=note, span=fit.spans.get(fold)):
                    inputs = signature_columns(model)  # the signature's columns (the prior is read from token)
                    log_params({"reranker": name, "fold": str(fold), "features": inputs, "tuned": fit.params.get(fold, {})})
                    log_metrics(scores)
                    key = (name, str(fold))
                    if key in self.trials:
                        self.trials[key].log()
                    self.scores[key] = scores
                    self.uris[key] = log_reranker(
                        model, model_name(self.model_prefix, name, fold), example, params={"features": ",".join(inputs)},
                        tags={"specrank.reranker": name, "specrank.fold": str(fold), "specrank.run": self.model_prefix or "",
                              NOTE_TAG: f"The {name} reranker of {self.model_prefix} that predicts fold {fold} (fitted "
                                        f"on the other fold's prompts); its metrics are held out. {LOAD_HINT}"})
        metrics = fold_means(self.scores)
        log_metrics(shared_metrics(metrics, fits))
        log_tables({"candidates": candidates_table(self.scores, self.uris)})
        set_description(training_note(metrics, fits))
        log_dataset(file_dataset(predictions), "output")
        mlflow.log_artifact(str(predictions))
        return {f"{n}-fold{f}": uri for (n, f), uri in self.uris.items()}

    def register(self, name: str, refit, alias: str, reranker: str):
        """Refit ``reranker`` on every prompt in a nested run ``<reranker>-all`` (``refit(reranker, callbacks)`` ->
        (fitted model, the table it was fitted on, tuned parameters)), log it and register it as a new version of
        ``name`` with ``alias``. Returns the ModelVersion."""
        candidates = candidates_table(self.scores, self.uris)
        chosen = reranker
        trials = TrialLogger("inner_mse")
        note = f"The {chosen} reranker refitted on every prompt, to be registered as `{name}`."
        tags = {"specrank.reranker": chosen, "specrank.fold": "all", "specrank.run": self.model_prefix or ""}
        with nested_run(f"{chosen}-all", tags=tags, description=note):
            model, table, tuned = refit(chosen, [trials])
            trials.log()
            rows, prompts = len(table), int(table["prompt_id"].nunique())
            fit_tags = {"specrank.reranker": chosen, "specrank.fold": "all", "specrank.training_rows": rows,
                        "specrank.training_prompts": prompts}
            log_params({"reranker": chosen, "training_rows": rows, "training_prompts": prompts,
                        "tuned": tuned})
            uri = log_reranker(model, model_name(self.model_prefix, chosen, "all").replace("-foldall", "-all"),
                               self.example, params={"features": ",".join(signature_columns(model))},
                               tags={**fit_tags, "specrank.run": self.model_prefix or "",
                                     NOTE_TAG: f"The {chosen} reranker of {self.model_prefix} fitted on all {prompts} "
                                               f"prompts (registered as `{name}`). {LOAD_HINT}"})
        best = candidates.set_index("reranker").loc[chosen, "heldout_mse"]
        version = register_reranker(uri, name, alias, tags={**fit_tags, "heldout_mse": f"{best:.6g}"})
        load = f"models:/{name}/{version.version}"
        description = champion_note(chosen, candidates, load, rows, prompts)
        mlflow.MlflowClient().update_model_version(name, version.version, description=description)
        return mlflow.MlflowClient().get_model_version(name, version.version)
