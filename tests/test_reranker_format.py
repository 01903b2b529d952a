"""Format 2 (no pickle): every reranker class saved and reloaded predicts identically, from a path, a zip and
an MLflow URI served by a real ``mlflow server``; loading runs no code from the file; a pickle is refused."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from specrank.featurize import featurize_rounds
from specrank.featurize.edges import edge_frame
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import (
    GBMReranker,
    IsotonicFirstFactor,
    PerDepthCalibration,
    RerankerFileError,
    StackedReranker,
    load_reranker,
)
from specrank.tracking.models import resolve_reranker
from specrank.rerankers.persist import META, describe, saved_params
from mlflow_store import mlflow_server  # noqa: F401  (fixture)

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("mlflow-format")

SMALL = {"n_estimators": 25, "num_leaves": 7, "n_jobs": 1}


@pytest.fixture(scope="module")
def tables():
    table, manifest = synthetic_rounds(10, 12, topk=4, depth=3, expand=3, seed=3)
    greedy = {**manifest, "temperature": 0.0}
    return {"sampling": featurize_rounds(table, manifest), "greedy": featurize_rounds(table, greedy),
            "edges": edge_frame(table, manifest)}


MODELS = {  # every class and backend, and both label kinds of sklearn's boosting (regressor, classifier)
    "isotonic": (IsotonicFirstFactor, {}, "sampling"),
    "per_depth": (PerDepthCalibration, {}, "edges"),
    "lightgbm_rows": (GBMReranker, {"features": "rows", **SMALL}, "sampling"),
    "lightgbm_greedy_boosted": (GBMReranker, {"features": "base", "boost_from_draft": True, "monotone_draft": True,
                                              **SMALL}, "greedy"),
    "sklearn_rows": (GBMReranker, {"features": "rows", "backend": "sklearn", **SMALL}, "sampling"),
    "sklearn_greedy": (GBMReranker, {"features": "base", "backend": "sklearn", **SMALL}, "greedy"),
    "stacked": (StackedReranker, {"features": "rows", **SMALL}, "sampling"),  # params: its first factor's
}


def _fit(cls, params, table, tables):
    if cls is StackedReranker:  # a Rows first factor and per-depth maps, fitted on the same rounds
        return cls(GBMReranker(**params), PerDepthCalibration(n_bins=20)).fit(tables[table], tables["edges"])
    return cls(**params).fit(tables[table])


@pytest.fixture(scope="module")
def fitted(tables):
    return {name: (_fit(cls, params, table, tables), tables[table]) for name, (cls, params, table) in MODELS.items()}


def assert_same_predictions(a, b, X):
    np.testing.assert_allclose(b.predict(X), a.predict(X), rtol=0, atol=1e-12)
    if not isinstance(a, PerDepthCalibration):  # first-factor predictions read first-level features
        np.testing.assert_allclose(b.predict_first_factor(X), a.predict_first_factor(X), rtol=0, atol=1e-12)
    if isinstance(a, StackedReranker):  # and the deeper factors, over every depth and probability
        depth, q = np.repeat(np.arange(1, 6), 101), np.tile(np.linspace(0.0, 1.0, 101), 5)
        np.testing.assert_allclose(b.predict_deeper_factors(depth, q), a.predict_deeper_factors(depth, q), rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("suffix", ["", ".zip"])
def test_every_reranker_reloads_identically_from_a_path(fitted, tmp_path, name, suffix):
    est, X = fitted[name]
    path = est.save(tmp_path / f"{name}{suffix}")
    back = load_reranker(path)
    assert type(back) is type(est) and saved_params(back) == saved_params(est)
    assert_same_predictions(est, back, X)
    assert back.meta_["feature_schema_hash"] == describe(est)["feature_schema_hash"]


def test_files_are_data_in_their_libraries_own_formats(fitted, tmp_path):
    est, _ = fitted["lightgbm_rows"]
    path = est.save(tmp_path / "rows")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "lightgbm.txt", META]
    meta = json.loads((path / META).read_text())
    assert {"class", "features", "label_kind", "topk", "versions", "params", "feature_schema_hash"} <= set(meta)
    assert meta["versions"]["lightgbm"] and meta["params"]["num_leaves"] == 7
    import lightgbm as lgb

    booster = lgb.Booster(model_str=(path / "lightgbm.txt").read_text())  # LightGBM's own text model
    assert booster.num_trees() == est.model_.num_trees()
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:  # plain arrays: no pickle needed
        np.testing.assert_array_equal(npz["prior.tokens"], est.prior_.tokens_)
    sk = fitted["sklearn_rows"][0].save(tmp_path / "sk")
    assert sorted(p.name for p in sk.iterdir()) == ["arrays.npz", META, "sklearn.skops"]
    iso = fitted["isotonic"][0].save(tmp_path / "iso")
    with np.load(iso / "arrays.npz", allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["iso.X_thresholds_"], fitted["isotonic"][0].iso_.X_thresholds_)


def _rewrite(path: Path, name: str, data: bytes) -> None:
    """Replace one file of a saved reranker and record its new sha256, as a forger would."""
    (path / name).write_bytes(data)
    meta = json.loads((path / META).read_text())
    meta["files"][name] = hashlib.sha256(data).hexdigest()
    (path / META).write_text(json.dumps(meta))


def test_damaged_or_forged_files_are_refused(fitted, tmp_path):
    est, _ = fitted["lightgbm_rows"]
    path = est.save(tmp_path / "rows")
    text = (path / "lightgbm.txt").read_bytes()
    (path / "lightgbm.txt").write_bytes(text[:-200])
    with pytest.raises(RerankerFileError, match="lightgbm.txt is damaged"):
        load_reranker(path)
    (path / "arrays.npz").unlink()
    with pytest.raises(RerankerFileError, match="arrays.npz is missing"):
        load_reranker(path)
    path = est.save(tmp_path / "rows")  # replaces the saved reranker there
    buf = io.BytesIO()
    np.savez(buf, evil=np.array([object()], dtype=object))  # an object array would need pickle to load
    _rewrite(path, "arrays.npz", buf.getvalue())
    with pytest.raises(RerankerFileError, match="pickle"):
        load_reranker(path)
    import functools

    import skops.io

    sk = fitted["sklearn_rows"][0].save(tmp_path / "sk")
    # exec, not print: Ray's progress bars replace builtins.print in a process that has run Ray
    _rewrite(sk, "sklearn.skops", skops.io.dumps(functools.partial(exec, "x")))
    with pytest.raises(RerankerFileError, match="not trusted: builtins.exec"):
        load_reranker(sk)
    path = est.save(tmp_path / "rows")
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({**meta, "class": "os.system"}))
    with pytest.raises(RerankerFileError, match="unknown reranker class 'os.system'"):
        load_reranker(path)
    with pytest.raises(RerankerFileError, match="not a saved reranker; not replacing"):
        est.save(tmp_path)  # a directory holding other things is never replaced


class Marker:
    """Unpickling this creates the file ``path`` (any code could run instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return Path(self.path).touch, ()


@pytest.fixture
def crafted(tmp_path):
    """(a crafted pickle offered as a reranker, the marker its unpickling would create)."""
    marker = tmp_path / "marker"
    path = tmp_path / "reranker.pkl"
    path.write_bytes(pickle.dumps({"format": "specrank-reranker/1", "estimator": Marker(marker)}))
    return path, marker


NOT_A_RERANKER = "not a specrank reranker \\(format 2 is a directory or a .zip\\)"


def test_a_crafted_pickle_is_refused_and_runs_nothing(crafted):
    path, marker = crafted
    with pytest.raises(RerankerFileError, match=NOT_A_RERANKER):
        load_reranker(path)
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # negative control: unpickling the file runs its code
    assert marker.exists()


def test_a_crafted_pickle_is_refused_by_the_decoder_and_online(crafted, tmp_path, capfd):
    from specrank.cli import main
    from specrank.decode import Decoder, load_drafter, load_target
    from specrank.testing import save_tiny_llama

    path, marker = crafted
    tgt = save_tiny_llama(tmp_path / "tgt", seed=0)
    target = load_target(tgt)
    drafter = load_drafter("early-exit:2", target)
    with pytest.raises(RerankerFileError, match=NOT_A_RERANKER):
        Decoder(target, drafter, "reranked", reranker=path)
    assert not marker.exists()
    out = tmp_path / "out"
    capfd.readouterr()
    rc = main(["online", "--target", str(tgt), "--drafter", "early-exit:2", "--strategies", "reranked", "--reranker",
               str(path), "--out", str(out), "--no-tracking"])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a specrank reranker (format 2 is a directory or a .zip)" in err[0]
    assert not marker.exists() and not out.exists()


def test_every_reranker_reloads_identically_from_a_real_mlflow_server(fitted, tables, mlflow_server,  # noqa: F811
                                                                       tmp_path):
    import mlflow

    from specrank import tracking
    from specrank.tracking.uri import tracking_store

    uris = {}
    with tracking.experiment_run("format2", run_name="models", tracking_uri=mlflow_server):
        for name, (est, X) in fitted.items():  # the model's input is first-level features, per_depth's too
            uris[name] = tracking.log_reranker(est, name, tables["sampling" if name == "per_depth" else MODELS[name][2]])
    for name, (est, X) in fitted.items():
        assert_same_predictions(est, resolve_reranker(uris[name], tracking_uri=mlflow_server), X)
    with tracking_store(mlflow_server):  # models:/ URIs resolve against the registry URI
        local = mlflow.artifacts.download_artifacts(uris["lightgbm_rows"], dst_path=str(tmp_path))
        names = {p.name for p in Path(local).rglob("*")}
        assert "python_model.pkl" not in names and {"reranker_model.py", META, "lightgbm.txt"} <= names
        pyfunc = mlflow.pyfunc.load_model(uris["isotonic"])  # MLflow's loader runs our code on the same artifact
    est, X = fitted["isotonic"]
    np.testing.assert_allclose(pyfunc.predict(X[["q"]].head(40)), est.predict_first_factor(X.head(40)), atol=1e-12)


# --- reranker.json is checked whole: a hand edit loads to the model it describes, or is one line naming a key

EDITED = ("isotonic", "per_depth", "lightgbm_greedy_boosted", "sklearn_rows", "stacked")


def _paths(node, path=()):
    """Every path into a JSON tree (keys of objects, indices of lists), the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield path + (key,)
        yield from _paths(child, path + (key,))


def _retyped(value) -> list:
    """The value in other JSON types, keeping what it says where a type can (7 -> 7.0, "7", [7])."""
    out = [None, True, [value], {"v": value}, 0 if isinstance(value, str) else json.dumps(value)]
    if isinstance(value, int) and not isinstance(value, bool):
        out.append(float(value))
    if isinstance(value, float) and value.is_integer():
        out.append(int(value))
    return [v for v in out if type(v) is not type(value)]


def _edit(meta: dict, how: str, path: tuple, choice: int):
    """(edited copy of ``meta``, the keys the error must name one of)."""
    meta = json.loads(json.dumps(meta))
    *parents, last = path
    node = meta
    for key in parents:
        node = node[key]
    keys = [k for k in path if isinstance(k, str)]
    if how == "add":
        target = node[last] if isinstance(node[last], dict) else node
        target["extra_key"] = choice
        return meta, keys + ["extra_key"]
    if how == "retype":
        options = _retyped(node[last])
        node[last] = options[choice % len(options)]
    elif isinstance(node, dict) and how == "remove":
        del node[last]
    elif isinstance(node, dict):  # rename
        node[f"{last}_renamed"] = node.pop(last)
    else:  # a list element removed or renamed: the list shrinks
        node.pop(last)
    return meta, keys or [str(path[0])]


def _canonical(meta: dict) -> str:
    """reranker.json as compared: versions (rewritten at every save) and the sha256 of files (skops does not
    write the same bytes twice) left out; 1, 1.0 and true all differ."""
    return json.dumps({k: v for k, v in meta.items() if k not in ("versions", "files")}, sort_keys=True)


@pytest.fixture(scope="module")
def saved(fitted, tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    return {name: fitted[name][0].save(root / name) for name in EDITED}


@pytest.mark.parametrize("name", EDITED)
def test_a_hand_edited_reranker_json_loads_as_written_or_fails_in_one_line(fitted, saved, tmp_path_factory, name):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from specrank.rerankers.persist import ADDED_PARAMETERS, reranker_files

    est, X = fitted[name]
    original = json.loads((saved[name] / META).read_text())
    paths = sorted(_paths(original), key=repr)
    root = tmp_path_factory.mktemp(f"edits_{name}")
    outcomes = {"loaded": 0, "refused": 0}

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(how=st.sampled_from(["remove", "add", "retype", "rename"]), path=st.sampled_from(paths),
           choice=st.integers(0, 5))
    def check(how, path, choice):
        if isinstance(path[-1], int):  # list elements are values, not keys: only their type is edited
            how = "retype"
        edited, keys = _edit(original, how, path, choice)
        target = root / f"{len(list(root.iterdir()))}"
        shutil.copytree(saved[name], target)
        (target / META).write_text(json.dumps(edited))
        try:
            back = load_reranker(target)
        except RerankerFileError as exc:
            message = str(exc)
            assert "\n" not in message and any(str(k) in message for k in keys), (how, path, message)
            outcomes["refused"] += 1
            return
        # a parameter added since format 2 began reads as the value older files were fitted with, and is saved
        added = how == "remove" and any(path[-1] in names for names in ADDED_PARAMETERS.values())
        assert _canonical(json.loads(reranker_files(back)[META])) == _canonical(original if added else edited), (
            how, path)
        assert edited["files"] == original["files"]
        assert_same_predictions(est, back, X)
        outcomes["loaded"] += 1

    check()
    assert outcomes["refused"] > 20  # the edits do reach the checks (and some, as of versions, load)


def _listed(path: Path, **changes) -> None:
    """Rewrite ``files`` of ``reranker.json`` (a name -> sha256, or None to drop the name)."""
    meta = json.loads((path / META).read_text())
    for name, digest in changes.items():
        if digest is None:
            meta["files"].pop(name.replace("_", "."), None)
        else:
            meta["files"][name.replace("_", ".")] = digest
    (path / META).write_text(json.dumps(meta))


def test_every_file_of_a_saved_reranker_is_covered(fitted, tmp_path):
    """Closed integrity: a file added, removed (from the directory or from the listing), or swapped is
    refused, and the format digest changes with any file that a forger re-lists."""
    from specrank.rerankers.persist import format_digest

    rows, other = fitted["lightgbm_rows"][0], fitted["lightgbm_greedy_boosted"][0]
    path = rows.save(tmp_path / "rows")
    digest = load_reranker(path).meta_["format_digest"]
    assert digest == format_digest({p.name: p.read_bytes() for p in path.iterdir()})
    zipped = load_reranker(rows.save(tmp_path / "rows.zip")).meta_["format_digest"]
    assert zipped == digest  # the same files, whatever holds them

    (path / "notes.txt").write_text("hello")
    with pytest.raises(RerankerFileError, match="notes.txt is not listed"):
        load_reranker(path)
    (path / "notes.txt").unlink()
    (path / "sub").mkdir()
    with pytest.raises(RerankerFileError, match="'sub'"):
        load_reranker(path)
    (path / "sub").rmdir()
    for name in ("arrays.npz", "lightgbm.txt"):
        data = (path / name).read_bytes()
        (path / name).unlink()
        with pytest.raises(RerankerFileError, match=f"{name} is missing"):
            load_reranker(path)
        (path / name).write_bytes(data)
    # another model's booster put in, and its entry deleted from the listing
    (path / "lightgbm.txt").write_bytes(other.model_.model_to_string().encode())
    _listed(path, lightgbm_txt=None)
    with pytest.raises(RerankerFileError, match="lightgbm.txt is not listed"):
        load_reranker(path)
    _listed(path, lightgbm_txt=hashlib.sha256((path / "lightgbm.txt").read_bytes()).hexdigest())
    forged = load_reranker(path).meta_["format_digest"]  # a consistent forgery loads, under another digest
    assert forged != digest
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({**meta, "files": {}}))
    with pytest.raises(RerankerFileError, match="arrays.npz is not listed"):
        load_reranker(path)
    path = rows.save(tmp_path / "rows")
    a, b = (path / "arrays.npz").read_bytes(), (path / "lightgbm.txt").read_bytes()
    (path / "arrays.npz").write_bytes(b)
    (path / "lightgbm.txt").write_bytes(a)
    with pytest.raises(RerankerFileError, match="is damaged"):
        load_reranker(path)
    path = rows.save(tmp_path / "rows")  # each file, and reranker.json itself, moves the digest
    for p in sorted(path.iterdir()):
        files = {q.name: q.read_bytes() for q in path.iterdir()}
        files[p.name] += b" "
        assert format_digest(files) != digest, p.name
    import zipfile

    with zipfile.ZipFile(tmp_path / "rows.zip", "a") as zf:
        zf.writestr("extra.bin", b"x")
    with pytest.raises(RerankerFileError, match="extra.bin is not listed"):
        load_reranker(tmp_path / "rows.zip")
    rows.save(tmp_path / "rows.zip")
    with warnings.catch_warnings(), zipfile.ZipFile(tmp_path / "rows.zip", "a") as zf:
        warnings.simplefilter("ignore")  # zipfile's own notice of a duplicate name
        zf.writestr("arrays.npz", b"a second arrays.npz")
    with pytest.raises(RerankerFileError, match="'arrays.npz'"):
        load_reranker(tmp_path / "rows.zip")


def test_the_class_and_backend_name_their_files(fitted, tmp_path):
    path = fitted["lightgbm_rows"][0].save(tmp_path / "rows")
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({**meta, "params": {**meta["params"], "backend": "sklearn"}}))
    with pytest.raises(RerankerFileError, match="sklearn.skops is not listed.*params.backend is 'sklearn'"):
        load_reranker(path)
    (path / META).write_text(json.dumps({**meta, "state": {}}))
    with pytest.raises(RerankerFileError, match="state.task_categories: missing"):
        load_reranker(path)
    (path / META).write_text(json.dumps({**meta, "params": {**meta["params"], "depth": 3}}))
    with pytest.raises(RerankerFileError, match="params.depth: not a parameter of GBMReranker"):
        load_reranker(path)


def _edited(path: Path, edit) -> None:
    meta = json.loads((path / META).read_text())
    edit(meta)
    (path / META).write_text(json.dumps(meta))


@pytest.mark.parametrize("name, key, value, field", [
    ("isotonic", ("n_bins",), 0, "params.n_bins"),
    ("lightgbm_rows", ("learning_rate",), -0.1, "params.learning_rate"),
    ("lightgbm_rows", ("backend",), "xgboost", "params.backend"),
    ("lightgbm_rows", ("monotone_draft",), 1, "params.monotone_draft"),
    ("stacked", ("first_factor", "params", "num_leaves"), 1, "params.first_factor.params.num_leaves"),
    ("stacked", ("per_depth", "params", "n_bins"), 0, "params.per_depth.params.n_bins"),
    ("stacked", ("per_depth", "class"), "GBMReranker", "params.per_depth.class"),
    ("stacked", ("first_factor", "class"), "StackedReranker", "params.first_factor.class"),
    ("stacked", ("first_factor", "params", "depth"), 3, "params.first_factor.params.depth"),
])
def test_a_parameter_out_of_its_range_is_refused_in_one_line_naming_it(fitted, tmp_path, name, key, value, field):
    path = fitted[name][0].save(tmp_path / name)

    def edit(meta):
        node = meta["params"]
        for k in key[:-1]:
            node = node[k]
        node[key[-1]] = value

    _edited(path, edit)
    with pytest.raises(RerankerFileError) as refused:
        load_reranker(path)
    message = str(refused.value)
    assert "\n" not in message and f"{field}:" in message, message


def test_a_stacked_reranker_is_one_model_with_closed_integrity(fitted, tmp_path):
    """One directory (or zip) of the usual files, each listed with its sha256 and nothing else; a file missing,
    added, damaged or unlisted, a part's state edited, or a part's arrays missing or extra is refused."""
    est, X = fitted["stacked"]
    path = est.save(tmp_path / "stacked")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "lightgbm.txt", META]
    meta = json.loads((path / META).read_text())
    assert meta["class"] == "StackedReranker" and set(meta["params"]) == set(meta["state"]) == {"first_factor",
                                                                                                "per_depth"}
    assert meta["features"] == est.first_factor_.features_ and meta["params"]["first_factor"]["class"] == "GBMReranker"
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        names = set(npz.files)
    assert {"first_factor.prior.tokens", "per_depth.depth1.X_thresholds_"} <= names
    assert all(n.split(".")[0] in ("first_factor", "per_depth") for n in names)
    back = load_reranker(path)
    assert isinstance(back.first_factor_, GBMReranker) and isinstance(back.per_depth_, PerDepthCalibration)
    assert_same_predictions(est, back, X)
    assert_same_predictions(est, load_reranker(est.save(tmp_path / "stacked.zip")), X)

    (path / "notes.txt").write_text("hello")
    with pytest.raises(RerankerFileError, match="notes.txt is not listed"):
        load_reranker(path)
    (path / "notes.txt").unlink()
    for name in ("arrays.npz", "lightgbm.txt"):
        data = (path / name).read_bytes()
        (path / name).unlink()
        with pytest.raises(RerankerFileError, match=f"{name} is missing"):
            load_reranker(path)
        (path / name).write_bytes(data[:-50])
        with pytest.raises(RerankerFileError, match=f"{name} is damaged"):
            load_reranker(path)
        (path / name).write_bytes(data)
    _listed(path, lightgbm_txt=None)
    with pytest.raises(RerankerFileError, match="files: lightgbm.txt is not listed, and a StackedReranker needs it "
                                                "\\(params.first_factor.params.backend is 'lightgbm'\\)"):
        load_reranker(path)
    path = est.save(tmp_path / "stacked")
    _edited(path, lambda m: m["params"]["first_factor"]["params"].update(backend="sklearn"))
    with pytest.raises(RerankerFileError, match="sklearn.skops is not listed.*params.first_factor.params.backend"):
        load_reranker(path)
    path = est.save(tmp_path / "stacked")
    _edited(path, lambda m: m["state"]["per_depth"].update(depths=m["state"]["per_depth"]["depths"][:-1]))
    with pytest.raises(RerankerFileError, match="array 'per_depth.depth.*' is not part of the state"):
        load_reranker(path)
    path = est.save(tmp_path / "stacked")
    _edited(path, lambda m: m["state"].pop("per_depth"))
    with pytest.raises(RerankerFileError, match="state.per_depth: missing"):
        load_reranker(path)
    path = est.save(tmp_path / "stacked")
    _edited(path, lambda m: m["state"]["first_factor"].pop("task_categories"))
    with pytest.raises(RerankerFileError, match="state.first_factor.task_categories: missing"):
        load_reranker(path)
    path = est.save(tmp_path / "stacked")
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for changed, message in (({k: v for k, v in arrays.items() if k != "first_factor.prior.means"},
                              "no array 'first_factor.prior.means'"),
                             ({**arrays, "per_depth.extra": np.zeros(2)}, "array 'per_depth.extra' is not part"),
                             ({**arrays, "prior.tokens": np.zeros(2, np.int64)}, "array 'prior.tokens' is not part")):
        buf = io.BytesIO()
        np.savez(buf, **changed)
        _rewrite(path, "arrays.npz", buf.getvalue())
        with pytest.raises(RerankerFileError, match=message):
            load_reranker(path)


def test_a_stacked_reranker_is_fitted_from_the_same_rounds_or_from_fitted_parts(fitted, tables):
    est, X = fitted["stacked"]
    assert est.first_factor_ is not est.first_factor and est.per_depth_ is not est.per_depth  # fitted clones
    again = StackedReranker.from_fitted(est.first_factor_, est.per_depth_)
    assert again.first_factor_ is est.first_factor_ and again.per_depth_ is est.per_depth_
    assert saved_params(again) == saved_params(est) and again.get_params()["first_factor"].get_params() == \
        est.first_factor_.get_params()
    assert_same_predictions(est, again, X)
    other = tables["edges"].copy()
    other.attrs = {"specrank": {**tables["edges"].attrs["specrank"], "rounds_digest": "a" * 64}}
    features = tables["sampling"].copy()
    features.attrs = {"specrank": {**tables["sampling"].attrs["specrank"], "rounds_digest": "b" * 64}}
    with pytest.raises(ValueError, match="edges: made from rounds a{64}, but the features are from rounds b{64}"):
        StackedReranker(GBMReranker(**SMALL), PerDepthCalibration()).fit(features, other)
    greedy_maps = PerDepthCalibration(n_bins=20).fit(edge_frame_of(tables, temperature=0.0))
    with pytest.raises(ValueError, match="per_depth: fitted on argmax labels, the first factor on probability"):
        StackedReranker.from_fitted(est.first_factor_, greedy_maps)
    with pytest.raises(ValueError, match="first_factor"):
        StackedReranker(first_factor="rows").fit(X, tables["edges"])


def edge_frame_of(tables, temperature):
    table, manifest = synthetic_rounds(10, 12, topk=4, depth=3, expand=3, seed=3)
    return edge_frame(table, {**manifest, "temperature": temperature})


def test_arrays_of_the_wrong_shape_or_type_are_refused(fitted, tmp_path):
    """A forger who re-lists ``arrays.npz`` still cannot hand the loader tables it would crash on."""
    path = fitted["isotonic"][0].save(tmp_path / "iso")
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    buf = io.BytesIO()
    np.savez(buf, **{**arrays, "iso.X_thresholds_": arrays["iso.X_thresholds_"].reshape(1, -1)})
    _rewrite(path, "arrays.npz", buf.getvalue())
    with pytest.raises(RerankerFileError, match="'iso.X_thresholds_' must be a non-empty vector"):
        load_reranker(path)
    buf = io.BytesIO()
    np.savez(buf, **{**arrays, "iso.y_thresholds_": arrays["iso.y_thresholds_"][:-1]})
    _rewrite(path, "arrays.npz", buf.getvalue())
    with pytest.raises(RerankerFileError, match="differ in length"):
        load_reranker(path)
