"""Saving and loading rerankers in their local formats.

Format 2 (``specrank-reranker/2``) is a directory, or a ``.zip`` of the same files, that loading reads as
data and never executes:

- ``reranker.json``: class, features, label kind, topk, versions, params, the feature-schema hash, the
  class's state that is not an array, and the sha256 of every other file (a damaged file is refused);
- ``arrays.npz``: the isotonic and per-depth tables and the token prior;
- ``lightgbm.txt``: a LightGBM booster as its own text model, or ``sklearn.skops``: sklearn's boosting.

A stacked reranker is one such model: its ``params`` and ``state`` hold each part's (``first_factor``,
``per_depth``) under the part's name, params as ``{"class": ..., "params": ...}``; its arrays are the parts'
arrays prefixed with the part's name; its booster is its first factor's.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import zipfile
from pathlib import Path

from sklearn.utils._param_validation import InvalidParameterError, validate_parameter_constraints
from sklearn.utils.validation import check_is_fitted

import specrank
from specrank.atomic import atomic_write, atomic_write_dir
from specrank.errors import first_line
from specrank.featurize.sets import CATEGORICAL_FEATURES, input_columns, resolve_features
from specrank.law import LABEL_KINDS
from specrank.rerankers.state import ARRAYS, PARTS, STACKED, encode, npz_bytes, required_files, tree_part
from specrank.versions import package_version

FORMAT = "specrank-reranker/2"
META = "reranker.json"
META_KEYS = ("class", "features", "label_kind", "topk", "version", "params", "feature_schema_hash", "state", "files")


class RerankerFileError(ValueError):
    """A reranker file or directory that is damaged, foreign or not to be trusted."""


def feature_schema_hash(features, label_kind: str, topk: int) -> str:
    """sha256 of what a reranker reads: feature names in order, the columns they come from, labels and topk."""
    schema = {"features": list(features), "columns": input_columns(features), "label_kind": label_kind,
              "topk": int(topk), "categorical": [f for f in features if f in CATEGORICAL_FEATURES]}
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()


def check_version(path, version: str) -> None:
    """Refuse a reranker saved by another major version of specrank."""
    if str(version).split(".")[0] != specrank.__version__.split(".")[0]:
        raise RerankerFileError(f"{path}: version {version!r}: saved by a specrank incompatible with "
                                f"{specrank.__version__}")


def describe(est) -> dict:
    """The metadata recorded with a fitted reranker (``rounds_digest``: of the run it was fitted on, when known)."""
    meta = {
        "class": type(est).__name__,
        "features": list(est.features_),
        "label_kind": est.label_kind_,
        "topk": est.topk_,
        "version": est.version_,
        "params": saved_params(est),
        "feature_schema_hash": feature_schema_hash(est.features_, est.label_kind_, est.topk_),
    }
    if getattr(est, "rounds_digest_", None):
        meta["rounds_digest"] = est.rounds_digest_
    if getattr(est, "card_", None):
        meta["card"] = est.card_
    return meta


def saved_params(est) -> dict:
    """The params recorded for ``est``: its own, or a stacked reranker's parts' classes and params."""
    if type(est).__name__ == STACKED:  # by name: the classes sit above this module
        return {part: {"class": type(p).__name__, "params": p.get_params()}
                for part, p in ((part, getattr(est, f"{part}_")) for part in PARTS)}
    return est.get_params()


def _versions() -> dict:
    names = ("specrank", "numpy", "scikit-learn", "lightgbm", "skops")
    return {name: version for name in names if (version := package_version(name)) is not None}


def reranker_files(est) -> dict[str, bytes]:
    """The files of ``est`` in format 2, ``reranker.json`` included."""
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


def read_members(path: Path) -> dict[str, bytes]:
    """Name -> bytes of every entry of a format-2 directory or zip. An entry that is not a plain top-level
    file (a subdirectory, a link, a nested name, a name given twice) is refused, since nothing would vouch
    for it; hidden files are read like the others, for the listing check to refuse."""
    if path.is_dir():
        entries = sorted(path.iterdir())
        odd = [p.name for p in entries if not p.is_file() or p.is_symlink()]
        files = {p.name: p.read_bytes() for p in entries if p.name not in odd}
    else:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            odd = [n for n in names if "/" in n or "\\" in n or names.count(n) > 1]  # nested, or given twice
            files = {n: zf.read(n) for n in names if n not in odd}
    if odd:
        raise RerankerFileError(f"{path}: holds {odd[0]!r}, which is not a file of a saved reranker")
    return files


def format_digest(files: dict[str, bytes]) -> str:
    """sha256 over every file of a saved reranker, ``reranker.json`` included (name and content of each):
    one value that changes whenever any file is added, removed, swapped or edited."""
    listing = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


SHA256 = re.compile(r"[0-9a-f]{64}")
# reranker.json: key -> (description, predicate), all required but ``versions``; other keys are refused.
META_SCHEMA = {
    "format": ("a string", lambda v: isinstance(v, str)),
    "class": ("a string", lambda v: isinstance(v, str)),
    "features": ("a non-empty list of strings",
                 lambda v: isinstance(v, list) and v and all(isinstance(f, str) for f in v)),
    "label_kind": (f"one of {', '.join(LABEL_KINDS)}", lambda v: isinstance(v, str) and v in LABEL_KINDS),
    "topk": ("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "version": ("a string", lambda v: isinstance(v, str)),
    "params": ("an object", lambda v: isinstance(v, dict)),
    "feature_schema_hash": ("a sha256 (64 hex digits)", lambda v: isinstance(v, str) and SHA256.fullmatch(v)),
    "state": ("an object", lambda v: isinstance(v, dict)),
    "files": ("an object of file name -> sha256",
              lambda v: isinstance(v, dict) and all(isinstance(d, str) and SHA256.fullmatch(d) for d in v.values())),
    "versions": ("an object of package -> version",
                 lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())),
    "rounds_digest": ("a sha256 (64 hex digits)", lambda v: isinstance(v, str) and SHA256.fullmatch(v)),
    # the model card a study writes: what the reranker learned from (its prompts' sha256), how it was chosen
    "card": ("an object whose training_prompts, if any, is a list of sha256", lambda v: isinstance(v, dict) and (
        "training_prompts" not in v or isinstance(v["training_prompts"], list)
        and all(isinstance(d, str) and SHA256.fullmatch(d) for d in v["training_prompts"]))),
}
OPTIONAL_META = ("versions", "rounds_digest", "card")


def check_meta(where: str, meta: dict) -> None:
    """Refuse a ``reranker.json`` outside ``META_SCHEMA``, naming the first key at fault."""
    for key in META_SCHEMA:
        if key not in meta and key not in OPTIONAL_META:
            raise RerankerFileError(f"{where}: {key}: missing")
    for key in meta:
        if key not in META_SCHEMA:
            raise RerankerFileError(f"{where}: {key}: not a key of {META}")
    for key, (expected, ok) in META_SCHEMA.items():
        if key in meta and not ok(meta[key]):
            raise RerankerFileError(f"{where}: {key}: must be {expected}; got {short(meta[key])}")


def short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Parameters added to a class after files of format 2 were written, with the value those files were fitted with:
# a file that lacks one reads as that value (and ``check_params`` fills it in, for the estimator built from it).
ADDED_PARAMETERS = {"GBMReranker": {"objective": "pointwise"}}


def check_params(where: str, cls, params: dict, features: list, classes: dict, key: str = "params") -> None:
    """``params`` (at ``key`` of ``reranker.json``) must name every parameter of ``cls.__init__`` and nothing
    else, each within the class's ``_parameter_constraints`` (scikit-learn's check, one parameter at a time so
    that the error names it); a set name in ``params.features`` must resolve to the saved ``features``. A stacked
    reranker's parts are checked as their own classes (``classes``: name -> class)."""
    names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    for name in names:
        if name not in params and name in ADDED_PARAMETERS.get(cls.__name__, {}):
            params[name] = ADDED_PARAMETERS[cls.__name__][name]  # a file written before the parameter existed
        if name not in params:
            raise RerankerFileError(f"{where}: {key}.{name}: missing")
    for name in params:
        if name not in names:
            raise RerankerFileError(f"{where}: {key}.{name}: not a parameter of {cls.__name__} "
                                    f"(expected {', '.join(names)})")
    if cls.__name__ == STACKED:
        for part, allowed in PARTS.items():
            check_part(where, f"{key}.{part}", params[part], allowed)
            check_params(where, classes[params[part]["class"]], params[part]["params"], features, classes,
                         f"{key}.{part}.params")
        return
    for name, constraint in cls._parameter_constraints.items():
        try:
            validate_parameter_constraints({name: constraint}, {name: params[name]}, caller_name=cls.__name__)
        except InvalidParameterError as exc:
            raise RerankerFileError(f"{where}: {key}.{name}: {first_line(exc)}") from None
    if "features" in params:
        try:
            resolved = resolve_features(params["features"])
        except ValueError as exc:
            raise RerankerFileError(f"{where}: {key}.features: {first_line(exc)}") from None
        if resolved != features:
            raise RerankerFileError(f"{where}: {key}.features: {short(params['features'])} is not the saved features")
    try:  # the constraints across parameters (boost_from_draft only with LightGBM)
        cls(**params).check_params()
    except ValueError as exc:
        raise RerankerFileError(f"{where}: {key}: {first_line(exc)}") from None


def check_part(where: str, key: str, part, allowed) -> None:
    """A stacked reranker's part in ``params``: exactly ``{"class": one of allowed, "params": an object}``."""
    expected = f"an object with class (one of {', '.join(allowed)}) and params (an object)"
    if not isinstance(part, dict) or set(part) != {"class", "params"}:
        raise RerankerFileError(f"{where}: {key}: must be {expected}; got {short(part)}")
    if part["class"] not in allowed:
        raise RerankerFileError(f"{where}: {key}.class: must be one of {', '.join(allowed)}; got {short(part['class'])}")
    if not isinstance(part["params"], dict):
        raise RerankerFileError(f"{where}: {key}.params: must be an object; got {short(part['params'])}")


def check_files(path, meta: dict, files: dict[str, bytes], classes: dict) -> None:
    """Closed integrity: the files present are exactly those listed, each with its sha256, and exactly the
    files of the class (and backend) that ``reranker.json`` names (``classes``: name -> class, whose ``codec``
    says them)."""
    listed, present = set(meta["files"]), set(files) - {META}
    trees, params = tree_part(meta["class"], meta["params"])  # params checked already (check_params)
    backend = "params.first_factor.params.backend" if meta["class"] == STACKED else "params.backend"
    needed = required_files(classes[trees].codec, params)
    for name in sorted(needed - listed):
        why = f" ({backend} is {params.get('backend')!r})" if "backend" in params else ""
        raise RerankerFileError(f"{path}/{META}: files: {name} is not listed, and a {meta['class']} needs it{why}")
    for name in sorted(listed - needed):
        why = f" with {backend} {params.get('backend')!r}" if "backend" in params else ""
        raise RerankerFileError(f"{path}/{META}: files: {name} is not a file of a {meta['class']}{why}")
    for name in sorted(present - listed):
        raise RerankerFileError(f"{path}: {name} is not listed in {META} (a file nothing vouches for)")
    for name in sorted(listed - present):
        raise RerankerFileError(f"{path}: {name} is missing")
    for name in sorted(listed):
        if hashlib.sha256(files[name]).hexdigest() != meta["files"][name]:
            raise RerankerFileError(f"{path}: {name} is damaged (its sha256 differs from {META})")


