"""Rerankers as MLflow pyfunc models: logged from our own code with the format-2 files as their artifact,
loaded back by URI for online decoding.

The pyfunc is ``RerankerModel`` (models from code: ``reranker_model.py`` is the logged script), so the
model holds code from this package and data, nothing cloudpickled. ``load_pyfunc_reranker`` downloads a
model and reads its artifact with the format-2 loader, without running the model's script.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import tempfile
import warnings
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import infer_signature

from specrank.featurize.features import META_KEY
from specrank.files import names_a_uri
from specrank.featurize.sets import input_columns
from specrank.rerankers.loader import load_format2, load_reranker
from specrank.rerankers.persist import RerankerFileError, format_digest, save_reranker
from specrank.tracking.uri import TrackingError, check_tracking_uri, resolve_tracking_uri, tracking_store

# Pinned so that MLflow does not infer requirements by importing the model in a subprocess.
_REQUIREMENTS = ("numpy", "pandas", "scikit-learn", "lightgbm", "skops", "mlflow")
ARTIFACT = "reranker"  # the artifact key of the format-2 files
MODEL_CODE = Path(__file__).with_name("reranker_model.py")
PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
DIGEST_TAG = "specrank.format_digest"


class RerankerModel(mlflow.pyfunc.PythonModel):
    """pyfunc: a DataFrame of first-level candidates' features -> first-factor predictions.

    The reranker is read from the ``reranker`` artifact in ``load_context``, or given directly.
    """

    def __init__(self, reranker=None):
        self.reranker = None
        if reranker is not None:
            self._set(reranker)

    def _set(self, reranker) -> None:
        if not callable(getattr(reranker, "predict_first_factor", None)):
            raise TypeError(f"{type(reranker).__name__} has no predict_first_factor(features) method")
        self.reranker = reranker
        # MLflow's schema enforcement drops DataFrame.attrs, where features carry their label kind and topk.
        self.meta = {"label_kind": getattr(reranker, "label_kind_", None), "topk": getattr(reranker, "topk_", None)}

    def load_context(self, context) -> None:
        self._set(load_format2(context.artifacts[ARTIFACT]))

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        features = model_input
        if META_KEY not in features.attrs:
            features = features.copy(deep=False)
            features.attrs[META_KEY] = dict(self.meta)
        return np.asarray(self.reranker.predict_first_factor(features), dtype=np.float64)


def signature_columns(reranker) -> list[str] | None:
    """The first-level columns the reranker's first factor reads: ``first_factor_features_`` (a per-depth map,
    fitted on edges, reads ``q``), else its fitted features' input columns; None when it names none."""
    if hasattr(reranker, "first_factor_features_"):
        return list(reranker.first_factor_features_)
    return input_columns(reranker.features_) if hasattr(reranker, "features_") else None


def _model_input(reranker, features: pd.DataFrame) -> pd.DataFrame:
    """The columns the reranker reads when all are present (the signature's inputs), categories as strings."""
    wanted = signature_columns(reranker)
    if wanted is not None and set(wanted) <= set(features.columns):  # else keep every column
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
    with tempfile.TemporaryDirectory() as tmp, quiet_pyfunc_logging():
        files = save_reranker(reranker, Path(tmp) / ARTIFACT)
        # the digest a loaded copy reports (``meta_["format_digest"]``): which logged model a run used
        tags = {**(tags or {}), DIGEST_TAG: format_digest({p.name: p.read_bytes() for p in files.iterdir()})}
        signature = infer_signature(example, wrapper.predict(None, example))
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=str(MODEL_CODE),
            artifacts={ARTIFACT: str(files)},
            signature=signature,
            input_example=example,
            pip_requirements=_requirements(),
            tags={k: str(v) for k, v in (tags or {}).items()} or None,
            params={k: str(v) for k, v in (params or {}).items()} or None,
        )
    return info.model_uri


@contextmanager
def quiet_pyfunc_logging():
    """Silence MLflow's per-model notices and artifact progress bars while a model is logged or
    downloaded (a few small files), which would drown a run's own output."""
    logger = logging.getLogger("mlflow.pyfunc")
    level, bar = logger.level, os.environ.get(PROGRESS_BAR)
    logger.setLevel(logging.ERROR)
    os.environ[PROGRESS_BAR] = "false"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="mlflow")  # a prefix: mlflow.* included
            yield
    finally:
        logger.setLevel(level)
        if bar is None:
            os.environ.pop(PROGRESS_BAR, None)
        else:
            os.environ[PROGRESS_BAR] = bar


# The URI schemes a reranker is read from, with the module MLflow needs for each and its package.
MODEL_SCHEMES = {
    "models": None, "runs": None, "mlflow-artifacts": None, "file": None,
    "s3": ("boto3", "boto3"),
    "gs": ("google.cloud.storage", "google-cloud-storage"),
    "wasbs": ("azure.storage.blob", "azure-storage-blob"),
    "abfss": ("azure.storage.filedatalake", "azure-storage-file-datalake"),
}


def check_model_uri(uri: str) -> None:
    """Refuse, before anything is downloaded, a model URI whose scheme is not one of ``MODEL_SCHEMES`` or whose
    client library is not installed. An http(s) URL is refused: nothing would check what it serves before
    it is read, so it is downloaded by hand and given as a path."""
    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        raise RerankerFileError(f"{uri}: an http(s) URL is not a reranker source; download the file and give its "
                                "path, or give a models:/ or runs:/ URI with --tracking-uri")
    if scheme not in MODEL_SCHEMES:
        raise RerankerFileError(f"{uri}: unsupported scheme {scheme}: (use a path or one of "
                                f"{', '.join(s + ':' for s in MODEL_SCHEMES)})")
    if MODEL_SCHEMES[scheme] is None:
        return
    module, package = MODEL_SCHEMES[scheme]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (google, azure) is missing too
        found = False
    if not found:
        raise RerankerFileError(f"{uri}: reading {scheme}:// needs the {package} package (pip install {package})")


def resolve_reranker(source, *, tracking_uri: str | None = None):
    """The one loader of every reranker source: the estimator itself, a local format (format-2 directory or
    zip: ``specrank.rerankers.load_reranker``), an MLflow model directory, or an
    MLflow model URI (``models:/...``, ``runs:/ID/NAME``) resolved against ``tracking_uri`` (default
    ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``, which must exist: nothing is created)."""
    if not isinstance(source, (str, Path)):
        return source
    path = Path(str(source)).expanduser()
    if path.is_dir() and (path / "MLmodel").is_file():
        return load_pyfunc_reranker(str(path))
    if not names_a_uri(source):
        return load_reranker(source)
    check_model_uri(str(source))
    return load_pyfunc_reranker(str(source), tracking_uri)


def load_pyfunc_reranker(uri: str, tracking_uri: str | None = None):
    """The reranker behind an MLflow model URI or local model directory (``resolve_reranker``
    is the loader to call). Remote URIs resolve against ``tracking_uri`` (default ``$MLFLOW_TRACKING_URI``,
    else ``./mlflow.db``), which must exist; the model is downloaded and its artifact read as data."""
    if Path(uri).is_dir():
        return _from_model_dir(Path(uri), uri)
    store = check_tracking_uri(resolve_tracking_uri(tracking_uri), write=False)
    with tempfile.TemporaryDirectory() as tmp, tracking_store(store), quiet_pyfunc_logging():
        try:
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        except mlflow.exceptions.MlflowException as exc:
            raise TrackingError(f"--reranker {uri}: no such model in {store} ({exc.message.splitlines()[0]})") from None
        return _from_model_dir(Path(local), uri)


def _from_model_dir(model_dir: Path, uri: str):
    if not (model_dir / "MLmodel").is_file():
        raise RerankerFileError(f"{uri}: not an MLflow model (no MLmodel)")
    conf = mlflow.models.Model.load(str(model_dir / "MLmodel")).flavors.get("python_function", {})
    artifacts = conf.get("artifacts") or {}
    if ARTIFACT in artifacts and MODEL_CODE.name in str(conf.get("model_code_path", "")):
        return load_format2(model_dir / artifacts[ARTIFACT]["path"])
    raise RerankerFileError(f"{uri}: not a specrank reranker model")
