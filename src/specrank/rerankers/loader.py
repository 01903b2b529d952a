"""The one loader of a reranker's local formats: format 2 (a directory or zip, read as data) and the
trusted format-1 pickle (``rerankers.legacy``). MLflow models load through ``specrank.tracking``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from specrank.featurize.prior import TokenPrior
from specrank.rerankers.gbm import GBMReranker
from specrank.rerankers.isotonic import IsotonicFirstFactor, PerDepthCalibration
from specrank.rerankers.legacy import load_pickle
from specrank.rerankers.persist import (
    FORMAT,
    META,
    META_KEYS,
    OPTIONAL_META,
    RerankerFileError,
    check_files,
    check_meta,
    check_params,
    check_version,
    feature_schema_hash,
    format_digest,
    read_members,
    short,
)
from specrank.rerankers.state import (
    ARRAYS,
    LIGHTGBM,
    SKLEARN,
    StateError,
    check_state,
    isotonic_from,
    npz_arrays,
    read_booster,
    read_skops,
)

CLASSES = {c.__name__: c for c in (IsotonicFirstFactor, PerDepthCalibration, GBMReranker)}


def decode(name: str, params: dict, state: dict, arrays: dict, files: dict[str, bytes]):
    """The estimator of class ``name`` (one of ``CLASSES``) with ``params`` and its fitted state."""
    if name not in CLASSES:
        raise StateError(f"unknown reranker class {name!r} (format 2 knows {', '.join(CLASSES)})")
    check_state(name, params, state, arrays)
    est = CLASSES[name](**params)
    if name == "IsotonicFirstFactor":
        est.iso_ = isotonic_from(arrays, "iso", state["iso"])
    elif name == "PerDepthCalibration":
        est.maps_ = {int(d): isotonic_from(arrays, f"depth{d}", state["iso"]) for d in state["depths"]}
    else:
        est.task_categories_ = list(state["task_categories"])
        est.prior_ = TokenPrior(state["prior_pseudo_count"])
        if "prior.tokens" in arrays:
            est.prior_.tokens_, est.prior_.means_ = arrays["prior.tokens"], arrays["prior.means"]
            est.prior_.mean_ = float(arrays["prior.mean"])
        est.model_ = read_booster(files[LIGHTGBM]) if est.backend == "lightgbm" else read_skops(files[SKLEARN])
    return est


def load_format2(path) -> object:
    """A reranker saved in format 2 (a directory or zip), checked whole before anything is built: the
    schema of ``reranker.json``, every file listed with its sha256 and nothing else present. ``meta_``
    holds its metadata and ``format_digest``."""
    path = Path(path)
    try:
        files = read_members(path)
    except zipfile.BadZipFile as exc:
        raise RerankerFileError(f"{path}: damaged zip ({exc})") from None
    if META not in files:
        raise RerankerFileError(f"{path}: no {META} (not a specrank reranker)")
    where = f"{path}/{META}"
    try:
        meta = json.loads(files[META])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RerankerFileError(f"{where}: malformed ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise RerankerFileError(f"{path}: format {short(got)}, expected {FORMAT}")
    check_meta(where, meta)
    if meta["class"] not in CLASSES:
        raise RerankerFileError(f"{where}: class: unknown reranker class {short(meta['class'])} "
                                f"(format 2 knows {', '.join(CLASSES)})")
    check_files(path, meta, files)
    check_version(path, meta["version"])
    if feature_schema_hash(meta["features"], meta["label_kind"], meta["topk"]) != meta["feature_schema_hash"]:
        raise RerankerFileError(f"{where}: feature_schema_hash does not match its features, label_kind and topk")
    check_params(where, CLASSES[meta["class"]], meta["params"], meta["features"])
    try:
        est = decode(meta["class"], meta["params"], meta["state"], npz_arrays(files[ARRAYS]), files)
    except StateError as exc:
        raise RerankerFileError(f"{path}: {exc}") from None
    est.features_, est.label_kind_, est.topk_, est.version_ = list(meta["features"]), meta["label_kind"], \
        int(meta["topk"]), meta["version"]
    est.rounds_digest_ = meta.get("rounds_digest")
    est.meta_ = {k: meta.get(k) for k in META_KEYS[:7] + OPTIONAL_META}
    est.meta_["format_digest"] = format_digest(files)
    return est


def load_reranker(source, *, trust_pickle: bool = False):
    """A fitted reranker from a local ``source``: the estimator itself, a format-2 directory or zip, or a
    format-1 pickle. MLflow models and model URIs load through ``specrank.tracking.resolve_reranker``.

    Nothing in the file is executed, except a format-1 pickle loaded with ``trust_pickle=True``, which warns.
    """
    if not isinstance(source, (str, Path)):
        return source
    path = Path(str(source)).expanduser()
    if path.is_dir() and (path / META).is_file():
        return load_format2(path)
    if path.is_file():
        if zipfile.is_zipfile(path):
            return load_format2(path)
        return load_pickle(path, trust_pickle)
    raise FileNotFoundError(f"no reranker at {source} (neither a saved reranker nor an MLflow model)")
