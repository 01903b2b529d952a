"""Saving and loading rerankers: one pickle file with a metadata header, written atomically, and the one
loader of every reranker source (a fitted estimator, a saved file, an MLflow model directory or URI).

Loading unpickles Python objects: only load files you trust (as with any scikit-learn model).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import specrank
from specrank.atomic import atomic_write

FORMAT = "specrank-reranker/1"


def describe(est) -> dict:
    """The metadata recorded with a fitted reranker."""
    return {
        "class": type(est).__name__,
        "features": list(est.features_),
        "label_kind": est.label_kind_,
        "topk": est.topk_,
        "version": est.version_,
        "params": est.get_params(),
    }


def save_reranker(est, path) -> None:
    """Write a fitted reranker and its metadata to ``path`` (temp file + os.replace)."""
    payload = {"format": FORMAT, "meta": describe(est), "estimator": est}
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)))


def read_payload(path) -> dict:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no reranker file {path}")
    with open(path, "rb") as fh:
        try:
            payload = pickle.load(fh)
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            raise ValueError(f"{path}: not a specrank reranker ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a specrank reranker file (expected format {FORMAT})")
    return payload


def load_reranker_file(path):
    """Load a reranker saved by ``save_reranker``; its ``meta_`` holds the recorded metadata."""
    payload = read_payload(path)
    est = payload["estimator"]
    est.meta_ = payload["meta"]
    if payload["meta"]["version"].split(".")[0] != specrank.__version__.split(".")[0]:
        raise ValueError(f"{path}: saved by specrank {payload['meta']['version']}, incompatible with {specrank.__version__}")
    return est


URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")


def load_reranker(source, *, tracking_uri: str | None = None):
    """A fitted reranker from ``source``: the estimator itself, a file saved by ``save_reranker``, an MLflow
    model directory, or an MLflow model URI (``models:/NAME/VERSION``, ``runs:/ID/NAME``) resolved against
    ``tracking_uri`` (default: MLflow's current one). MLflow is imported only for MLflow sources."""
    if not isinstance(source, (str, Path)):
        return source
    path = Path(str(source)).expanduser()
    if path.is_file():
        return load_reranker_file(path)
    if path.is_dir() or not URI.match(str(source)):
        if not (path / "MLmodel").is_file():
            raise FileNotFoundError(f"no reranker at {source} (neither a saved reranker nor an MLflow model)")
        from specrank.tracking.models import load_pyfunc_reranker

        return load_pyfunc_reranker(str(path))
    from specrank.tracking.models import load_pyfunc_reranker

    return load_pyfunc_reranker(str(source), tracking_uri)
