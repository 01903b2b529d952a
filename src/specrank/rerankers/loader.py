"""The one loader of a reranker's local format: format 2, a directory or zip read as data. MLflow models load
through ``specrank.tracking``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from specrank.rerankers.registry import CLASSES
from specrank.rerankers.stacked import StackedReranker
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
from specrank.rerankers.state import ARRAYS, PARTS, STACKED, StateError, check_state, npz_arrays

def decode(name: str, params: dict, state: dict, arrays: dict, files: dict[str, bytes], meta: dict):
    """The estimator of class ``name`` (one of ``registry.CLASSES``) with ``params``, its checked fitted state
    (``check_state``, read back by the class's codec) and the metadata of ``reranker.json``."""
    if name == STACKED:
        parts = {part: decode(params[part]["class"], params[part]["params"], state[part],
                              {k.removeprefix(f"{part}."): v for k, v in arrays.items() if k.startswith(f"{part}.")},
                              files, meta) for part in PARTS}
        parts["per_depth"].features_ = ["depth", "q_edge"]  # what it reads from edges (reranker.json: the first factor's)
        return StackedReranker.from_fitted(parts["first_factor"], parts["per_depth"])
    est = CLASSES[name](**params)
    est.features_, est.label_kind_, est.topk_ = list(meta["features"]), meta["label_kind"], int(meta["topk"])
    est.version_, est.rounds_digest_ = meta["version"], meta.get("rounds_digest")
    CLASSES[name].codec.decode(est, state, arrays, files)
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
    check_params(where, CLASSES[meta["class"]], meta["params"], meta["features"], CLASSES)
    check_files(path, meta, files, CLASSES)
    check_version(path, meta["version"])
    if feature_schema_hash(meta["features"], meta["label_kind"], meta["topk"]) != meta["feature_schema_hash"]:
        raise RerankerFileError(f"{where}: feature_schema_hash does not match its features, label_kind and topk")
    try:
        arrays = npz_arrays(files[ARRAYS])
        check_state(meta["class"], meta["params"], meta["state"], arrays, CLASSES)
        est = decode(meta["class"], meta["params"], meta["state"], arrays, files, meta)
    except StateError as exc:
        raise RerankerFileError(f"{path}: {exc}") from None
    est.version_ = meta["version"]
    if "card" in meta:
        est.card_ = meta["card"]
    est.meta_ = {k: meta.get(k) for k in META_KEYS[:7] + OPTIONAL_META}
    est.meta_["format_digest"] = format_digest(files)
    return est


def load_reranker(source):
    """A fitted reranker from a local ``source``: the estimator itself, or a format-2 directory or zip (nothing
    in it is executed; any other file, a pickle included, is refused). MLflow models and model URIs load
    through ``specrank.tracking.resolve_reranker``."""
    if not isinstance(source, (str, Path)):
        return source
    path = Path(str(source)).expanduser()
    if path.is_dir() and (path / META).is_file():
        return load_format2(path)
    if path.is_file():
        if zipfile.is_zipfile(path):
            return load_format2(path)
        raise RerankerFileError(f"{path}: not a specrank reranker (format 2 is a directory or a .zip)")
    raise FileNotFoundError(f"no reranker at {source} (neither a saved reranker nor an MLflow model)")
