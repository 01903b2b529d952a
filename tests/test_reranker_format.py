"""Format 2 (no pickle): every reranker class saved and reloaded predicts identically, from a path, a zip and
an MLflow URI served by a real ``mlflow server``; loading runs no code from the file; pickles only when trusted."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from specrank.featurize import featurize_rounds
from specrank.featurize.edges import edge_frame
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration, RerankerFileError, load_reranker
from specrank.rerankers.legacy import TrustedPickleWarning, UntrustedPickleError
from specrank.rerankers.persist import META, describe
from mlflow_store import mlflow_server  # noqa: F401  (fixture)

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
}


@pytest.fixture(scope="module")
def fitted(tables):
    return {name: (cls(**params).fit(tables[table]), tables[table]) for name, (cls, params, table) in MODELS.items()}


def assert_same_predictions(a, b, X):
    np.testing.assert_allclose(b.predict(X), a.predict(X), rtol=0, atol=1e-12)
    if not isinstance(a, PerDepthCalibration):  # first-factor predictions read first-level features
        np.testing.assert_allclose(b.predict_first_factor(X), a.predict_first_factor(X), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("suffix", ["", ".zip"])
def test_every_reranker_reloads_identically_from_a_path(fitted, tmp_path, name, suffix):
    est, X = fitted[name]
    path = est.save(tmp_path / f"{name}{suffix}")
    back = load_reranker(path)
    assert type(back) is type(est) and back.get_params() == est.get_params()
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
    _rewrite(sk, "sklearn.skops", skops.io.dumps(functools.partial(print, "x")))
    with pytest.raises(RerankerFileError, match="not trusted: builtins.print"):
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


def test_a_crafted_pickle_is_refused_and_runs_nothing(crafted):
    path, marker = crafted
    with pytest.raises(UntrustedPickleError, match="--trust-pickle"):
        load_reranker(path)
    assert not marker.exists()
    # negative control: trusting the file runs its code
    with pytest.warns(TrustedPickleWarning), pytest.raises(RerankerFileError):
        load_reranker(path, trust_pickle=True)
    assert marker.exists()


def test_a_crafted_pickle_is_refused_by_the_decoder_and_online(crafted, tmp_path, capfd):
    from specrank.cli import main
    from specrank.decode import Decoder, load_drafter, load_target
    from specrank.testing import save_tiny_llama

    path, marker = crafted
    tgt = save_tiny_llama(tmp_path / "tgt", seed=0)
    target = load_target(tgt)
    drafter = load_drafter("early-exit:2", target)
    with pytest.raises(UntrustedPickleError):
        Decoder(target, drafter, "reranked", reranker=path)
    assert not marker.exists()
    out = tmp_path / "out"
    capfd.readouterr()
    rc = main(["online", "--target", str(tgt), "--drafter", "early-exit:2", "--rules", "reranked", "--reranker",
               str(path), "--out", str(out), "--no-tracking"])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--trust-pickle" in err[0]
    assert not marker.exists() and not out.exists()
    with pytest.warns(TrustedPickleWarning), pytest.raises(RerankerFileError):
        Decoder(target, drafter, "reranked", reranker=path, trust_pickle=True)
    assert marker.exists()  # negative control


def test_a_format_1_pickle_loads_only_when_trusted(fitted, tmp_path):
    est, X = fitted["lightgbm_rows"]
    path = tmp_path / "old.pkl"
    path.write_bytes(pickle.dumps({"format": "specrank-reranker/1", "meta": describe(est), "estimator": est}))
    with pytest.raises(UntrustedPickleError):
        load_reranker(path)
    with pytest.warns(TrustedPickleWarning, match="re-save"):
        back = load_reranker(path, trust_pickle=True)
    assert_same_predictions(est, back, X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re-saved, it loads as data, without a warning
        assert_same_predictions(est, load_reranker(back.save(tmp_path / "new")), X)


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
        assert_same_predictions(est, load_reranker(uris[name], tracking_uri=mlflow_server), X)
    with tracking_store(mlflow_server):  # models:/ URIs resolve against the registry URI
        local = mlflow.artifacts.download_artifacts(uris["lightgbm_rows"], dst_path=str(tmp_path))
        names = {p.name for p in Path(local).rglob("*")}
        assert "python_model.pkl" not in names and {"reranker_model.py", META, "lightgbm.txt"} <= names
        pyfunc = mlflow.pyfunc.load_model(uris["isotonic"])  # MLflow's loader runs our code on the same artifact
    est, X = fitted["isotonic"]
    np.testing.assert_allclose(pyfunc.predict(X[["q"]].head(40)), est.predict_first_factor(X.head(40)), atol=1e-12)
