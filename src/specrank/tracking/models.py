"""Rerankers as MLflow pyfunc models: logged with a signature, loaded back by URI for online decoding."""

from __future__ import annotations

import logging
import re
import warnings
from contextlib import contextmanager
from importlib import metadata

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import infer_signature

from specrank.featurize.features import META_KEY
from specrank.tracking.uri import check_reachable, resolve_tracking_uri

# Pinned so that MLflow does not infer requirements by importing the model in a subprocess.
_REQUIREMENTS = ("numpy", "pandas", "scikit-learn", "lightgbm", "mlflow")


class RerankerModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: a DataFrame of first-level candidates' features -> first-factor predictions."""

    def __init__(self, reranker):
        if not callable(getattr(reranker, "predict_first_factor", None)):
            raise TypeError(f"{type(reranker).__name__} has no predict_first_factor(features) method")
        self.reranker = reranker
        # MLflow's schema enforcement drops DataFrame.attrs, where features carry their label kind and topk.
        self.meta = {"label_kind": getattr(reranker, "label_kind_", None), "topk": getattr(reranker, "topk_", None)}

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        features = model_input
        if META_KEY not in features.attrs:
            features = features.copy(deep=False)
            features.attrs[META_KEY] = dict(self.meta)
        return np.asarray(self.reranker.predict_first_factor(features), dtype=np.float64)


def _model_input(reranker, features: pd.DataFrame) -> pd.DataFrame:
    """The columns the reranker reads when all are present (the signature's inputs), categories as strings."""
    if hasattr(reranker, "features_"):
        from specrank.rerankers.online import input_columns

        wanted = input_columns(reranker.features_)
        if set(wanted) <= set(features.columns):  # else (per-depth maps read ``q`` online) keep every column
            features = features[wanted]
    features = features.copy()
    for col in features.columns[features.dtypes == "category"]:  # MLflow schemas have no categorical type
        features[col] = features[col].astype(str)
    return features


def _requirements() -> list[str]:
    pins = []
    for name in ("specrank",) + _REQUIREMENTS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pins.append(name)
    return pins


_BAD_NAME = re.compile(r"[/:.%\"' ]")  # refused in logged model names (mlflow.utils.validation._validate_logged_model_name)


def model_name(prefix: str | None, reranker: str, fold) -> str:
    """``<prefix>-<reranker>-fold<f>`` (e.g. ``demo-t1-rows-fold0``), in characters MLflow accepts."""
    name = f"{prefix}-{reranker}-fold{fold}" if prefix else f"{reranker}-fold{fold}"
    return _BAD_NAME.sub("_", name)


def log_reranker(reranker, name: str, input_example: pd.DataFrame, *, tags: dict | None = None,
                 params: dict | None = None) -> str:
    """Log ``reranker`` to the active run as a pyfunc model named ``name`` with an inferred signature;
    return its model URI. ``tags`` and ``params`` go on the logged model (its page in the Models tab)."""
    if mlflow.active_run() is None:
        raise RuntimeError("log_reranker needs an active run (use experiment_run first)")
    wrapper = RerankerModel(reranker)
    example = _model_input(reranker, input_example.head(20).reset_index(drop=True))
    with quiet_pyfunc_logging():
        signature = infer_signature(example, wrapper.predict(None, example))
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=wrapper,
            signature=signature,
            input_example=example,
            pip_requirements=_requirements(),
            tags={k: str(v) for k, v in (tags or {}).items()} or None,
            params={k: str(v) for k, v in (params or {}).items()} or None,
        )
    return info.model_uri


@contextmanager
def quiet_pyfunc_logging():
    """Silence MLflow's per-model notices while logging: it warns about every Python-object model
    (ours pickle on purpose) and about integer schema columns, drowning a run's own output."""
    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="mlflow")  # a prefix: mlflow.* included
            yield
    finally:
        logger.setLevel(level)


def load_pyfunc_reranker(uri: str, tracking_uri: str | None = None):
    """The reranker object behind an MLflow model URI or local model directory (see
    ``specrank.rerankers.load_reranker``, the loader to call); remote URIs resolve against ``tracking_uri``
    (default: the current MLflow URI), checked reachable first."""
    if tracking_uri is None:
        return _unwrap(mlflow.pyfunc.load_model(uri))
    resolved = check_reachable(resolve_tracking_uri(tracking_uri))
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(resolved)
    try:
        return _unwrap(mlflow.pyfunc.load_model(uri))
    finally:
        mlflow.set_tracking_uri(previous)


def _unwrap(model):
    inner = model.unwrap_python_model()
    if not isinstance(inner, RerankerModel):
        raise ValueError(f"MLflow model {model.metadata.model_uuid} is not a specrank reranker")
    return inner.reranker
