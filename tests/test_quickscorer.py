"""QuickScorer arrays against LightGBM's own predict (exactly, and a perturbed model fails), what they refuse,
the fallback, and the isotonic rerankers' array lookups against sklearn's predict."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

lgb = pytest.importorskip("lightgbm")
pytest.importorskip("numba")

from specrank.featurize import TokenPrior, round_inputs  # noqa: E402
from specrank.featurize.block import round_block  # noqa: E402
from specrank.featurize.columns import COLUMN  # noqa: E402
from specrank.featurize.features import META_KEY, feature_meta  # noqa: E402
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, compiled  # noqa: E402
from specrank.rerankers.isotonic import binned_isotonic, isotonic_lookup  # noqa: E402
from specrank.rerankers.base import unit_interval  # noqa: E402
from specrank.rerankers.quickscorer import QuickScorer, Unsupported, arrays_of, quickscorer_of  # noqa: E402

F = 6


def booster(seed=0, trees=30, leaves=15, objective="binary"):
    """A booster over F features: a categorical column 0, NaNs in columns 1-3 (missing type NaN), none in 4-5
    (missing type None: a missing value at prediction is read as 0.0)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3000, F))
    X[:, 0] = rng.integers(0, 5, len(X))
    X[:, 1:4][rng.random((len(X), 3)) < 0.15] = np.nan
    y = (rng.random(len(X)) < 1 / (1 + np.exp(-np.nan_to_num(X[:, 1]) - (X[:, 0] == 2) - X[:, 4]))).astype(float)
    params = {"objective": objective, "num_leaves": leaves, "min_data_in_leaf": 10, "verbose": -1,
              "num_threads": 1, "deterministic": True, "seed": 0}
    return lgb.train(params, lgb.Dataset(X, y, categorical_feature=[0]), trees)


def random_rows(n=10_000, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)) * 1.5
    X[:, 0] = rng.integers(-1, 7, n) + rng.choice([0.0, 0.5], n)  # unseen, negative and fractional categories
    X[rng.random((n, F)) < 0.1] = np.nan
    return X


def test_quickscorer_equals_lightgbm_predict_and_a_perturbed_model_fails():
    b = booster()
    arrays = arrays_of(b)
    assert len(arrays.cat_features) and len(arrays.nan_trees)  # categorical and missing-value nodes are exercised
    X = random_rows()
    trees = QuickScorer(b)
    np.testing.assert_array_equal(trees.raw(X), b.predict(X, raw_score=True))  # the same float64 sum
    one_round = np.repeat(X[:1], 10, 0)
    one_round[:, 1] = X[:10, 1]  # most columns the same in every row: applied once, to the shared words
    np.testing.assert_array_equal(trees.raw(one_round), b.predict(one_round, raw_score=True))
    perturbed = lgb.Booster(model_str=b.model_to_string())
    perturbed.set_leaf_output(0, 0, perturbed.get_leaf_output(0, 0) + 1e-3)  # one leaf of one tree
    assert np.abs(QuickScorer(perturbed).raw(X) - b.predict(X, raw_score=True)).max() > 1e-9


def a_round(seed=5, topk=6, m=40, vocab=50):
    """One round's ``RoundInputs``: a random pool (first level first, parents before children) and retained rows
    (3, vocab) with NaNs, read at the first-level tokens."""
    rng = np.random.default_rng(seed)
    parent = np.full(m, -1, np.int64)
    for i in range(topk, m):
        parent[i] = rng.integers(0, i)
    depth = np.ones(m, np.int64)
    for i in range(topk, m):
        depth[i] = depth[parent[i]] + 1
    token = rng.choice(vocab, m).astype(np.int64)
    token[:topk] = rng.choice(vocab, topk, replace=False)
    q = rng.dirichlet(np.ones(topk)).astype(np.float32)
    q_edge = np.concatenate([np.sort(q)[::-1], rng.random(m - topk).astype(np.float32)])
    draft_logp = np.log(q_edge).astype(np.float32)
    rows = np.log(rng.dirichlet(np.ones(vocab), 3)).astype(np.float32)
    rows[rng.random(rows.shape) < 0.2] = np.nan
    return round_inputs(token, parent, depth, q_edge, draft_logp, topk, int(token[0]), 30.0, 12.0, 2.0, rows,
                        token[:topk], 3.0, 1.0)


def test_a_round_scored_inside_the_kernel_equals_its_features_matrix_through_lightgbm():
    b = booster(seed=6)
    trees = QuickScorer(b)
    inputs = a_round()
    block = round_block(inputs)  # the features kernel's own block
    positions, columns = np.array([1, 2, 3, 5]), np.array([COLUMN["q"], COLUMN["cache_logp"], COLUMN["sib_gap"],
                                                           COLUMN["preceding_logp"]])
    prior_tokens = np.sort(inputs.token[:4])  # two first-level tokens have a prior, the rest the default
    means = np.linspace(0.1, 0.4, 4)
    m = np.empty((inputs.topk, F))
    m[:, positions] = block[:, columns]
    m[:, 0] = 2.0  # the task's code
    prior = TokenPrior(pseudo_count=0.0).fit(prior_tokens, means)  # each token once: its mean is its label
    m[:, 4] = prior.transform(inputs.token[: inputs.topk])
    plan = (positions, columns, 4, prior.tokens_, prior.means_, prior.mean_, 0)
    got = trees.round_probabilities(inputs, trees.round_model(plan), 2.0)
    want = 1 / (1 + np.exp(-b.predict(m, raw_score=True)))
    assert np.isnan(block[:, COLUMN["cache_logp"]]).any() and len(np.unique(m[:, 4])) > 1  # NaNs, two priors
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    shifted = (positions, columns, 4, prior.tokens_, prior.means_ + 1.5, prior.mean_, 0)  # the priors read
    assert np.abs(trees.round_probabilities(inputs, trees.round_model(shifted), 2.0) - want).max() > 1e-9


def test_63_leaf_trees_at_the_rerankers_size_are_exact():
    b = booster(seed=2, trees=40, leaves=63, objective="cross_entropy")
    X = random_rows(seed=3)
    np.testing.assert_array_equal(QuickScorer(b).raw(X), b.predict(X, raw_score=True))


def test_what_the_arrays_cannot_hold_is_left_to_lightgbm():
    wide = booster(seed=4, trees=3, leaves=80)
    assert max(wide.dump_model()["tree_info"][0]["num_leaves"], 0) > 64
    with pytest.raises(Unsupported, match="more than 64 leaves"):
        arrays_of(wide)
    trees, how = quickscorer_of(wide)
    assert trees is None and how.startswith("LightGBM predict (no QuickScorer arrays: Unsupported")
    with pytest.raises(ValueError, match="rows of 5 features, the trees read 6"):
        QuickScorer(booster(seed=5, trees=2)).raw(np.zeros((2, 5)))


def _features(n=400, seed=5):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"q": rng.random(n), "token": rng.integers(0, 30, n), "task": "t"})
    for c in ("log_q", "sib_rank", "position"):
        df[c] = rng.normal(size=n)
    df["label"] = (rng.random(n) < df["q"]).astype(float)
    df.attrs[META_KEY] = feature_meta("argmax", 4, 0.0)
    return df


def test_gbm_reranker_quickscorer_and_fallback_agree_and_name_their_path(monkeypatch):
    X = _features()
    est = GBMReranker(features=["q", "log_q", "sib_rank", "position", "task", "token_prior"], n_estimators=20,
                      num_leaves=7, min_child_samples=5, n_jobs=1).fit(X)
    fallback = est.predict(X)
    fitted = dict(vars(est))
    slow = compiled(est, "lightgbm")
    assert slow.inference == "LightGBM predict" and slow.trees is None and slow.predict_round is None
    with pytest.raises(ValueError, match="'gpu' is not one of quickscorer, lightgbm"):
        compiled(est, "gpu")
    fast = compiled(est)
    assert fast.inference == "QuickScorer arrays (numba)" and fast.trees is not None and fast.predict_round is not None
    np.testing.assert_allclose(fast.trees.raw(est._matrix(X, est.prior_.transform(X["token"]))),
                               est.model_.predict(est._matrix(X, est.prior_.transform(X["token"])), raw_score=True),
                               rtol=0, atol=1e-12)
    assert vars(est).keys() == fitted.keys() and all(vars(est)[k] is v for k, v in fitted.items())  # nothing added
    np.testing.assert_array_equal(est.predict(X), fallback)
    monkeypatch.setenv("SPECRANK_TREES", "lightgbm")
    assert compiled(est).inference == "LightGBM predict" and compiled(est).trees is None
    np.testing.assert_allclose(fallback, est.model_.predict(est._matrix(X, est.prior_.transform(X["token"]))),
                               rtol=0, atol=1e-12)
    copy = pickle.loads(pickle.dumps(est))  # a plain estimator: it pickles as fitted, with nothing to leave behind
    assert vars(copy).keys() == fitted.keys()
    np.testing.assert_allclose(copy.predict(X), fallback, rtol=0, atol=1e-12)


def test_isotonic_lookup_equals_sklearn_predict():
    rng = np.random.default_rng(6)
    q = rng.random(3000)
    iso = binned_isotonic(q, (rng.random(3000) < q ** 2).astype(float), 50)
    t = rng.random(10_000) * 1.4 - 0.2  # outside the fitted range too
    np.testing.assert_allclose(isotonic_lookup(iso, t), iso.predict(t), rtol=0, atol=1e-12)
    t32 = t.astype(np.float32)  # a pool's own probabilities: converted as np.interp converts them
    np.testing.assert_array_equal(isotonic_lookup(iso, t32), iso.predict(t32.astype(np.float64)))
    assert np.isnan(isotonic_lookup(iso, np.array([np.nan])))[0]
    flat = binned_isotonic(np.full(40, 0.3), np.ones(40), 50)  # one threshold: its value everywhere
    assert len(flat.X_thresholds_) == 1
    np.testing.assert_array_equal(isotonic_lookup(flat, np.array([0.0, 0.3, 2.0])), flat.predict([0.0, 0.3, 2.0]))
    p = np.array([-0.5, -0.0, 0.0, 0.25, 1.0, np.nextafter(1.0, 2.0), 1.5, np.nan, -np.inf, np.inf])
    np.testing.assert_array_equal(unit_interval(p), np.clip(p, 0.0, 1.0))
    est = IsotonicFirstFactor(n_bins=20).fit(_features())
    assert compiled(est).inference.startswith("array lookup")
    np.testing.assert_allclose(est.predict(_features(seed=7)), np.clip(est.iso_.predict(_features(seed=7)["q"]), 0, 1),
                               rtol=0, atol=1e-12)


def closure_kernel(digest, keyed=True):
    """A kernel built as ``featurize.kernel.compile_kernels`` builds the cached kernels: ``digest`` in a closure
    cell (``keyed``), or captured by nothing."""
    import numba

    if keyed:
        @numba.njit(cache=True)
        def plus_one(x):
            digest  # noqa: B018
            return x + 1
    else:
        @numba.njit(cache=True)
        def plus_one(x):
            return x + 1
    return plus_one


def test_the_cached_kernels_are_keyed_on_the_code_and_constants_they_compile_in(monkeypatch, tmp_path):
    """The two features kernels and the round kernel hold ``frozen_digest`` of what they compile in, in a closure
    cell; the digest moves with a constant another file defines; the bodies they call are not cached. numba's cache
    key includes a closure's cells: another digest misses the cache, the same one hits it; without the cell,
    another digest would load the stale kernel (the negative control)."""
    import numba
    from numba.core.caching import NullCache

    from specrank.featurize import kernel
    from specrank.rerankers import quickscorer_kernel

    cells = lambda f: [c.cell_contents for c in f.py_func.__closure__]  # noqa: E731
    key = kernel.frozen_digest(kernel)
    assert [cells(k) for k in kernel.kernels()] == [[key], [key]]
    assert cells(quickscorer_kernel.round_kernel()) == [kernel.frozen_digest(kernel, quickscorer_kernel)]
    for cached in (*kernel.kernels(), quickscorer_kernel.round_kernel()):
        assert cached._cache.__class__.__name__ == "FunctionCache"  # cache=True
    assert all(isinstance(f._cache, NullCache) for f in (kernel.fill_round, kernel.fill_online_round))
    monkeypatch.setattr(kernel, "SIB_RANK", kernel.SIB_RANK + 1)  # as an edit of columns.py would
    assert kernel.frozen_digest(kernel) != key
    monkeypatch.setattr(kernel, "NO_ROW", np.zeros(0, np.float64))  # absent.py's arrays count by dtype and shape
    assert len({kernel.frozen_digest(kernel), key}) == 2
    monkeypatch.undo()
    assert kernel.frozen_digest(kernel) == key

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    def stats(digest, keyed=True):
        f = closure_kernel(digest, keyed)
        assert f(1) == 2
        return sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values())

    assert stats("a") == (0, 1) and stats("a") == (1, 0) and stats("b") == (0, 1)
    assert stats("a", keyed=False) == (0, 1) and stats("b", keyed=False) == (1, 0)


CALLEES = """import numba
from pk.constants import STEP

@numba.njit
def add_step(x):
    return x + STEP

@numba.njit(cache=True)
def add_step_cached(x):
    return x + STEP
"""
CALLERS = """import numba
import pk.callees
from pk.callees import add_step, add_step_cached
from specrank.featurize.kernel import frozen_digest

def compile_callers(key):
    @numba.njit(cache=True)
    def caller(x):
        key  # noqa: B018
        return add_step(x) * 10

    @numba.njit(cache=True)
    def caller_of_cached(x):
        key  # noqa: B018
        return add_step_cached(x) * 10
    return caller, caller_of_cached

print(*(f(1) for f in compile_callers(frozen_digest(pk.callees))))
"""


def test_a_keyed_caller_recompiles_an_uncached_callee_and_links_a_cached_one_stale(tmp_path):
    """Why the bodies the cached kernels call are not cached, in numba itself (fresh processes, as later runs
    are): a constant another file defines changes; the keyed callers recompile; an uncached callee is compiled
    with its caller anew (the right answer), a cached one is loaded from its own cache, stale (the negative
    control)."""
    pk = tmp_path / "pk"
    pk.mkdir()
    (pk / "__init__.py").write_text("")
    (pk / "callees.py").write_text(CALLEES)
    (pk / "callers.py").write_text(CALLERS)

    def run(step):
        (pk / "constants.py").write_text(f"STEP = {step}\n")
        src = str(Path(__file__).parents[1] / "src")
        out = subprocess.run([sys.executable, "-m", "pk.callers"], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), src])}, timeout=120)
        assert out.returncode == 0, out.stderr
        return [int(v) for v in out.stdout.split()]

    assert run(1) == [20, 20] and run(1) == [20, 20]  # compiled, then loaded from the cache
    assert run(5) == [60, 20]
