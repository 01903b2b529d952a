"""The fitted state of each reranker as data (format 2): numeric arrays, LightGBM's own text model, and
sklearn's histogram boosting through skops with an explicit list of trusted types.

Nothing here unpickles: arrays are read with ``allow_pickle=False``, the LightGBM text is parsed by
LightGBM, skops rebuilds only the types named in ``SKOPS_TRUSTED`` (besides its safe defaults), and the
estimator class comes from ``rerankers.registry.CLASSES``, never from a name in the file. Each class's ``Codec``
says what it stores (``GBMReranker.codec`` is ``GBM``, and so on).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import lightgbm as lgb
import numpy as np
import sklearn
from sklearn.isotonic import IsotonicRegression

from specrank.featurize.prior import TokenPrior
from specrank.featurize.sets import PRIOR_FEATURE, resolve_features

ARRAYS = "arrays.npz"
LIGHTGBM = "lightgbm.txt"
SKLEARN = "sklearn.skops"
STACKED = "StackedReranker"
# A stacked reranker's parts: parameter -> the classes it may be; each part's state is stored under its name, its
# arrays prefixed with it, its other files (a first factor's booster) as they are.
PARTS = {"first_factor": ("IsotonicFirstFactor", "GBMReranker"), "per_depth": ("PerDepthCalibration",)}
# What a fitted HistGradientBoosting{Regressor,Classifier} holds beyond skops' default-trusted types
# (sklearn estimators, numpy arrays): its trees' predictors and a functools.partial of sklearn's own
# check_array (skops rebuilds a partial only around a function that is itself trusted).
SKOPS_TRUSTED = (
    "functools.partial",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.utils.validation.check_array",
)
ISOTONIC_FITTED = ("X_thresholds_", "y_thresholds_", "X_min_", "X_max_", "increasing_")
OUT_OF_BOUNDS = ("nan", "clip", "raise")


class StateError(ValueError):
    """A saved reranker's state that cannot be rebuilt safely."""


def npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (object arrays, which would need pickle, are refused)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except ValueError as exc:  # numpy's refusal of object arrays, or a malformed member
        raise StateError(f"{ARRAYS}: {exc}") from None


def isotonic_arrays(iso: IsotonicRegression, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}.{k}": np.asarray(getattr(iso, k)) for k in ISOTONIC_FITTED}


def isotonic_from(arrays: dict, prefix: str, params: dict) -> IsotonicRegression:
    """An IsotonicRegression rebuilt from its tables through sklearn's own unpickling hook (``__setstate__``
    rebuilds the interpolator), with the running sklearn's version: the tables mean the same in any."""
    iso = IsotonicRegression(**params)
    fitted = {k: arrays[f"{prefix}.{k}"] for k in ISOTONIC_FITTED}
    fitted = {k: (v if v.ndim else v[()]) for k, v in fitted.items()}
    iso.__setstate__({**vars(iso), **fitted, "_sklearn_version": sklearn.__version__})
    return iso


@dataclass(frozen=True)
class Codec:
    """How format 2 stores one estimator class's fitted state (the class names it: ``cls.codec``).

    ``encode(est) -> (state, arrays, files)``: JSON state, numeric arrays, other files; ``decode(est, state, arrays,
    files)`` sets the fitted attributes on ``est`` (built from its saved params; ``features_`` and the metadata set
    already); ``state``: each key of ``state`` -> (description, predicate), checked before anything is built;
    ``arrays(params, state)``: the names of the arrays it needs; ``files(params)``: its files besides the arrays."""

    encode: Callable
    decode: Callable
    state: dict
    arrays: Callable = lambda params, state: []
    files: Callable = lambda params: set()


def encode(est) -> tuple[dict, dict[str, np.ndarray], dict[str, bytes]]:
    """(JSON state, arrays, other files) of a fitted reranker."""
    name = type(est).__name__  # by name: the classes sit above this module
    if name == STACKED:
        state, arrays, files = {}, {}, {}
        for part in PARTS:
            state[part], own, more = encode(getattr(est, f"{part}_"))
            arrays.update({f"{part}.{k}": v for k, v in own.items()})
            files.update(more)
        return state, arrays, files
    codec = getattr(type(est), "codec", None)
    if codec is None:
        raise StateError(f"cannot save a {name}: it has no format-2 codec (rerankers.registry, \"Adding a reranker\")")
    return codec.encode(est)


def encode_isotonic(est):
    return {"iso": est.iso_.get_params()}, isotonic_arrays(est.iso_, "iso"), {}


def decode_isotonic(est, state, arrays, files) -> None:
    est.iso_ = isotonic_from(arrays, "iso", state["iso"])


def encode_per_depth(est):
    depths = sorted(int(d) for d in est.maps_)
    arrays = {k: v for d in depths for k, v in isotonic_arrays(est.maps_[d], f"depth{d}").items()}
    return {"depths": depths, "iso": est.maps_[depths[0]].get_params()}, arrays, {}


def decode_per_depth(est, state, arrays, files) -> None:
    est.maps_ = {int(d): isotonic_from(arrays, f"depth{d}", state["iso"]) for d in state["depths"]}


def encode_gbm(est):
    arrays = {}
    if hasattr(est.prior_, "tokens_"):
        arrays = {"prior.tokens": est.prior_.tokens_, "prior.means": est.prior_.means_,
                  "prior.mean": np.float64(est.prior_.mean_)}
    state = {"task_categories": list(est.task_categories_), "prior_pseudo_count": est.prior_.pseudo_count}
    if est.backend == "lightgbm":
        return state, arrays, {LIGHTGBM: est.model_.model_to_string().encode()}

    import skops.io  # skops imports torch when it is installed: only where a model is written

    return state, arrays, {SKLEARN: skops.io.dumps(est.model_)}


def decode_gbm(est, state, arrays, files) -> None:
    est.task_categories_ = list(state["task_categories"])
    est.prior_ = TokenPrior(state["prior_pseudo_count"])
    if "prior.tokens" in arrays:
        est.prior_.tokens_, est.prior_.means_ = arrays["prior.tokens"], arrays["prior.means"]
        est.prior_.mean_ = float(arrays["prior.mean"])
    est.model_ = read_booster(files[LIGHTGBM]) if est.backend == "lightgbm" else read_skops(files[SKLEARN])


def tree_part(name: str, params: dict) -> tuple[str, dict]:
    """(class, params) of the part that holds the files: a stacked reranker's first factor (its params checked
    already), else the reranker itself."""
    if name == STACKED:
        return params["first_factor"]["class"], params["first_factor"]["params"]
    return name, params


def required_files(codec: Codec, params: dict) -> set[str]:
    """The files (besides ``reranker.json``) a saved reranker of a class with ``codec`` (a stacked one's: of its
    first factor, ``tree_part``) consists of, no more."""
    return {ARRAYS} | set(codec.files(params))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


# What each class's ``state`` holds: key -> (description, predicate). Types are strict (a bool is not an
# integer, a string is not a number) so that a hand-edited value is refused rather than coerced.
ISO_STATE = {
    "increasing": ("true, false or 'auto'", lambda v: isinstance(v, bool) or v == "auto"),
    "out_of_bounds": (f"one of {', '.join(OUT_OF_BOUNDS)}", lambda v: isinstance(v, str) and v in OUT_OF_BOUNDS),
    "y_min": ("a finite number or null", lambda v: v is None or _is_number(v)),
    "y_max": ("a finite number or null", lambda v: v is None or _is_number(v)),
}
ISOTONIC_STATE = {"iso": ("an object", lambda v: isinstance(v, dict))}
PER_DEPTH_STATE = {
    "depths": ("a non-empty list of distinct integers >= 1",
               lambda v: isinstance(v, list) and v and len(set(map(repr, v))) == len(v)
               and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in v)),
    "iso": ("an object", lambda v: isinstance(v, dict)),
}
GBM_STATE = {
    "task_categories": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v)),
    "prior_pseudo_count": ("a finite number >= 0", lambda v: _is_number(v) and v >= 0),
}


def isotonic_tables(params: dict, state: dict) -> list[str]:
    return [f"iso.{k}" for k in ISOTONIC_FITTED]


def per_depth_tables(params: dict, state: dict) -> list[str]:
    return [f"depth{d}.{k}" for d in state["depths"] for k in ISOTONIC_FITTED]


def gbm_arrays(params: dict, state: dict) -> list[str]:
    return ["prior.tokens", "prior.means", "prior.mean"] if PRIOR_FEATURE in resolve_features(params["features"]) else []


def gbm_files(params: dict) -> set[str]:
    return {LIGHTGBM if params.get("backend") == "lightgbm" else SKLEARN}


ISOTONIC = Codec(encode_isotonic, decode_isotonic, ISOTONIC_STATE, isotonic_tables)
PER_DEPTH = Codec(encode_per_depth, decode_per_depth, PER_DEPTH_STATE, per_depth_tables)
GBM = Codec(encode_gbm, decode_gbm, GBM_STATE, gbm_arrays, gbm_files)


def _check_keys(where: str, got: dict, checks: dict) -> None:
    """Exactly the keys of ``checks``, each value passing its predicate; the first violation names its key."""
    for key in checks:
        if key not in got:
            raise StateError(f"{where}.{key}: missing")
    for key in got:
        if key not in checks:
            raise StateError(f"{where}.{key}: not a key of this class (expected {', '.join(checks)})")
    for key, (expected, ok) in checks.items():
        if not ok(got[key]):
            raise StateError(f"{where}.{key}: must be {expected}; got {got[key]!r}")


def wanted_arrays(name: str, params: dict, state: dict, classes: dict, where: str = "state",
                  prefix: str = "") -> list[str]:
    """The arrays a ``state`` of class ``name`` (``classes``: name -> class) needs, once the state's keys are
    checked (a stacked reranker's part: its state under ``where``, its arrays named ``prefix`` + key)."""
    if name == STACKED:
        _check_keys(where, state, {part: ("an object", lambda v: isinstance(v, dict)) for part in PARTS})
        return [key for part in PARTS for key in wanted_arrays(params[part]["class"], params[part]["params"],
                                                                state[part], classes, f"{where}.{part}", f"{part}.")]
    codec = classes[name].codec
    _check_keys(where, state, codec.state)
    if "iso" in state and isinstance(state["iso"], dict):
        _check_keys(f"{where}.iso", state["iso"], ISO_STATE)
    return [f"{prefix}{key}" for key in codec.arrays(params, state)]


def check_state(name: str, params: dict, state: dict, arrays: dict, classes: dict) -> None:
    """Refuse a ``state`` (or arrays) that does not describe a fitted ``name``, naming the key."""
    wanted = wanted_arrays(name, params, state, classes)
    missing = [k for k in wanted if k not in arrays]
    if missing:
        raise StateError(f"{ARRAYS}: no array {missing[0]!r}")
    extra = sorted(set(arrays) - set(wanted))
    if extra:  # e.g. the tables of a depth that state.depths no longer names
        raise StateError(f"{ARRAYS}: array {extra[0]!r} is not part of the state (state.depths edited?)"
                         if ".depth" in f".{extra[0]}" else f"{ARRAYS}: array {extra[0]!r} is not part of the state")
    for key in wanted:
        _check_array(key, arrays[key])
    pairs = [(key, key.replace("X_thresholds_", "y_thresholds_")) for key in wanted if key.endswith("X_thresholds_")]
    pairs += [(key, key.replace("prior.tokens", "prior.means")) for key in wanted if key.endswith("prior.tokens")]
    for first, second in pairs:
        if len(arrays[first]) != len(arrays[second]):
            raise StateError(f"{ARRAYS}: {first!r} and {second!r} differ in length")


# (number of dimensions, numpy kinds) of each array of the state, by the last part of its name
ARRAY_SHAPES = {
    "X_thresholds_": (1, "f"), "y_thresholds_": (1, "f"), "X_min_": (0, "f"), "X_max_": (0, "f"),
    "increasing_": (0, "b"), "tokens": (1, "iu"), "means": (1, "f"), "mean": (0, "f"),
}


def _check_array(key: str, value: np.ndarray) -> None:
    if key.rsplit(".", 1)[1] not in ARRAY_SHAPES:  # another class's array: its codec's decode checks it
        return
    ndim, kinds = ARRAY_SHAPES[key.rsplit(".", 1)[1]]
    if value.ndim != ndim or value.dtype.kind not in kinds or (ndim and not len(value) and "thresholds" in key):
        shape = "a scalar" if ndim == 0 else "a non-empty vector" if "thresholds" in key else "a vector"
        raise StateError(f"{ARRAYS}: array {key!r} must be {shape} of kind {kinds!r}; "
                         f"got shape {value.shape}, dtype {value.dtype}")


def read_booster(text: bytes):
    try:
        return lgb.Booster(model_str=text.decode())
    except (lgb.basic.LightGBMError, UnicodeDecodeError) as exc:
        raise StateError(f"{LIGHTGBM}: not a LightGBM model ({str(exc).splitlines()[0]})") from None


def read_skops(data: bytes):
    import skops.io  # pulls torch in: only where a model is read

    untrusted = sorted(set(skops.io.get_untrusted_types(data=data)) - set(SKOPS_TRUSTED))
    if untrusted:
        raise StateError(f"{SKLEARN}: holds types that are not trusted: {', '.join(untrusted[:5])}")
    return skops.io.loads(data, trusted=list(SKOPS_TRUSTED))
