"""Saving and loading rerankers, and the one loader of every reranker source.

Format 2 (``specrank-reranker/2``) is a directory, or a ``.zip`` of the same files, that loading reads as
data and never executes:

- ``reranker.json``: class, features, label kind, topk, versions, params, the feature-schema hash, the
  class's state that is not an array, and the sha256 of every other file (a damaged file is refused);
- ``arrays.npz``: the isotonic and per-depth tables and the token prior;
- ``lightgbm.txt``: a LightGBM booster as its own text model, or ``sklearn.skops``: sklearn's boosting.

Format 1 was a pickle: it loads only with ``trust_pickle=True`` (``--trust-pickle``), with a warning.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import specrank
from specrank.atomic import atomic_write, atomic_write_dir

FORMAT = "specrank-reranker/2"
META = "reranker.json"
META_KEYS = ("class", "features", "label_kind", "topk", "version", "params", "feature_schema_hash", "state", "files")
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")


class RerankerFileError(ValueError):
    """A reranker file or directory that is damaged, foreign or not to be trusted."""


def feature_schema_hash(features, label_kind: str, topk: int) -> str:
    """sha256 of what a reranker reads: feature names in order, the columns they come from, labels and topk."""
    from specrank.featurize.sets import CATEGORICAL_FEATURES
    from specrank.rerankers.online import input_columns

    schema = {"features": list(features), "columns": input_columns(features), "label_kind": label_kind,
              "topk": int(topk), "categorical": [f for f in features if f in CATEGORICAL_FEATURES]}
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()


def check_version(path, version: str) -> None:
    """Refuse a reranker saved by another major version of specrank."""
    if str(version).split(".")[0] != specrank.__version__.split(".")[0]:
        raise RerankerFileError(f"{path}: saved by specrank {version}, incompatible with {specrank.__version__}")


def describe(est) -> dict:
    """The metadata recorded with a fitted reranker."""
    return {
        "class": type(est).__name__,
        "features": list(est.features_),
        "label_kind": est.label_kind_,
        "topk": est.topk_,
        "version": est.version_,
        "params": est.get_params(),
        "feature_schema_hash": feature_schema_hash(est.features_, est.label_kind_, est.topk_),
    }


def _versions() -> dict:
    from importlib import metadata

    names = ("specrank", "numpy", "scikit-learn", "lightgbm", "skops")
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def reranker_files(est) -> dict[str, bytes]:
    """The files of ``est`` in format 2, ``reranker.json`` included."""
    from sklearn.utils.validation import check_is_fitted

    from specrank.rerankers.state import ARRAYS, encode, npz_bytes

    check_is_fitted(est, "features_")
    state, arrays, files = encode(est)
    files = {ARRAYS: npz_bytes(arrays), **files}
    meta = {"format": FORMAT, **describe(est), "versions": _versions(), "state": state,
            "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}}
    return {META: json.dumps(meta, indent=1, default=str).encode(), **files}


def save_reranker(est, path) -> Path:
    """Write a fitted reranker in format 2: a directory at ``path``, or a zip when it ends in ``.zip``
    (atomically; an older saved reranker there is replaced, anything else is refused)."""
    path = Path(path)
    files = reranker_files(est)
    if path.suffix == ".zip":
        return atomic_write(path, lambda tmp: _write_zip(tmp, files))
    if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not (path / META).is_file())):
        raise RerankerFileError(f"{path}: exists and is not a saved reranker; not replacing it")

    def write_dir(tmp):
        for name, data in files.items():
            Path(tmp, name).write_bytes(data)

    return atomic_write_dir(path, write_dir)


def _write_zip(target, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)


def _members(path: Path) -> dict[str, bytes]:
    """Name -> bytes of the files of a format-2 directory or zip (only plain top-level names are read)."""
    if path.is_dir():
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if "/" not in n and not n.startswith(".")}


def load_format2(path) -> object:
    """A reranker saved in format 2 (a directory or zip); ``meta_`` holds its metadata."""
    from specrank.rerankers.state import ARRAYS, CLASSES, StateError, decode, npz_arrays

    path = Path(path)
    try:
        files = _members(path)
    except zipfile.BadZipFile as exc:
        raise RerankerFileError(f"{path}: damaged zip ({exc})") from None
    if META not in files:
        raise RerankerFileError(f"{path}: no {META} (not a specrank reranker)")
    try:
        meta = json.loads(files[META])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RerankerFileError(f"{path}/{META}: malformed ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise RerankerFileError(f"{path}: format {got!r}, expected {FORMAT}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise RerankerFileError(f"{path}/{META}: missing {', '.join(missing)}")
    if meta["class"] not in CLASSES:
        raise RerankerFileError(f"{path}: unknown reranker class {meta['class']!r} (format 2 knows {', '.join(CLASSES)})")
    for name, digest in meta["files"].items():
        if name not in files:
            raise RerankerFileError(f"{path}: {name} is missing")
        if hashlib.sha256(files[name]).hexdigest() != digest:
            raise RerankerFileError(f"{path}: {name} is damaged (its sha256 differs from {META})")
    check_version(path, meta["version"])
    if feature_schema_hash(meta["features"], meta["label_kind"], meta["topk"]) != meta["feature_schema_hash"]:
        raise RerankerFileError(f"{path}: feature-schema hash does not match its features ({META} edited?)")
    try:
        est = decode(meta["class"], meta["params"], meta["state"], npz_arrays(files[ARRAYS]), files)
    except StateError as exc:
        raise RerankerFileError(f"{path}: {exc}") from None
    est.features_, est.label_kind_, est.topk_, est.version_ = list(meta["features"]), meta["label_kind"], \
        int(meta["topk"]), meta["version"]
    est.meta_ = {k: meta.get(k) for k in META_KEYS[:7] + ("versions",)}
    return est


def load_reranker(source, *, tracking_uri: str | None = None, trust_pickle: bool = False):
    """A fitted reranker from ``source``: the estimator itself, a format-2 directory or zip, an MLflow model
    directory, or an MLflow model URI (``models:/...``, ``runs:/ID/NAME``) resolved against ``tracking_uri``
    (default ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``, which must exist: nothing is created).

    Nothing in the file is executed, except a format-1 pickle (or an MLflow model that MLflow cloudpickled)
    loaded with ``trust_pickle=True``, which warns. MLflow is imported only for MLflow sources.
    """
    if not isinstance(source, (str, Path)):
        return source
    path = Path(str(source)).expanduser()
    if path.is_dir() and (path / META).is_file():
        return load_format2(path)
    if path.is_dir() and (path / "MLmodel").is_file():
        from specrank.tracking.models import load_pyfunc_reranker

        return load_pyfunc_reranker(str(path), trust_pickle=trust_pickle)
    if path.is_file():
        if zipfile.is_zipfile(path):
            return load_format2(path)
        from specrank.rerankers.legacy import load_pickle

        return load_pickle(path, trust_pickle)
    if path.exists() or not URI.match(str(source)):
        raise FileNotFoundError(f"no reranker at {source} (neither a saved reranker nor an MLflow model)")
    from specrank.tracking.models import load_pyfunc_reranker

    return load_pyfunc_reranker(str(source), tracking_uri, trust_pickle=trust_pickle)
