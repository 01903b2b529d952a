"""A reranker's per-step work on the engine's device: the trees scored as tensors equal LightGBM's margins."""

import lightgbm as lgb
import numpy as np
import pytest
import torch

from specrank.engines.device.forest import forest_of
from specrank.featurize import featurize_rounds
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import GBMReranker


@pytest.fixture(scope="module")
def fitted():
    features = featurize_rounds(*synthetic_rounds(12, 20, topk=6, depth=3, expand=4, seed=5))
    model = GBMReranker(features="rows", n_estimators=60, num_leaves=15, min_child_samples=5, n_jobs=1).fit(features)
    return model, features


def test_the_device_forest_scores_a_rerankers_rows_as_lightgbm_does(fitted):
    model, features = fitted
    m = model._matrix(features, model.prior_of(features))  # rows with missing row features and a category
    assert np.isnan(m).any()
    expected = model.model_.predict(m, raw_score=True)
    got = forest_of(model.model_).margins(torch.from_numpy(m)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # a negative control: the trees read one feature off by one no longer agree
    shifted = forest_of(model.model_)
    shifted.feature = (shifted.feature + 1) % m.shape[1]
    assert np.abs(shifted.margins(torch.from_numpy(m)).numpy() - expected).max() > 1e-3


def test_missing_values_and_categories_take_lightgbms_ways():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3))
    x[:, 2] = rng.integers(0, 5, 600)
    y = (x[:, 0] > 0.3) * 1.0 + (x[:, 2] == 3) * 2.0 + rng.normal(0, 0.1, 600)
    x[rng.random(600) < 0.2, 0] = np.nan
    for missing in (True, False):  # NaN as missing (a default way) or read as 0.0
        params = {"objective": "regression", "num_leaves": 7, "min_data_in_leaf": 5, "verbose": -1,
                  "use_missing": missing, "deterministic": True}
        booster = lgb.train(params, lgb.Dataset(x, y, categorical_feature=[2]), num_boost_round=20)
        test = np.vstack([x[:50], [[np.nan, 0.0, 3.0], [0.5, 1.0, np.nan], [0.5, 1.0, -2.0], [0.5, 1.0, 70.0]]])
        got = forest_of(booster).margins(torch.from_numpy(test)).numpy()
        np.testing.assert_allclose(got, booster.predict(test, raw_score=True), rtol=0, atol=1e-12)
        for column, value in ((2, 3.0), (2, 1.0), (2, np.nan), (0, np.nan), (0, 0.5)):  # a column held fixed
            fixed = test.copy()
            fixed[:, column] = value
            folded = forest_of(booster).fold(column, value)
            assert not folded.any_categorical or column != 2
            got = folded.margins(torch.from_numpy(test)).numpy()  # the folded trees never read the column
            np.testing.assert_allclose(got, booster.predict(fixed, raw_score=True), rtol=0, atol=1e-12)


def first_step_inputs(table, features):
    """``FirstStepInputs`` of a rounds table's rounds (its first-level candidates, its retained rows), the
    per-round context read from the features table (one row per candidate, round by round)."""
    from specrank.engines.device.first_token import FirstStepInputs

    frame = table.to_pandas()
    k = int(features["cand"].max()) + 1
    col = lambda name: np.stack(frame[name].to_numpy())[:, :k]  # noqa: E731
    per_round = lambda name: torch.from_numpy(features[name].to_numpy(np.float64)[::k].copy())  # noqa: E731
    rows = np.stack([col("cache_logp"), col("same_token_logp"), col("preceding_logp")], axis=1)
    return FirstStepInputs(torch.from_numpy(col("q_edge").astype(np.float32)), torch.from_numpy(col("token")),
                           torch.from_numpy(frame["root_token"].to_numpy(np.int64)), per_round("prompt_len"),
                           per_round("position"), per_round("prev_accepted"), torch.from_numpy(rows.astype(np.float32)),
                           unknown_as_nan(frame["cache_age"]), unknown_as_nan(frame["prev_tree_root_token_count"]))


def unknown_as_nan(column) -> torch.Tensor:
    """A rounds table's age or count, -1 where unknown, as the device path holds it (NaN)."""
    x = column.to_numpy(np.float64)
    return torch.from_numpy(np.where(x >= 0, x, np.nan))


@pytest.fixture(scope="module")
def recorded():
    """Synthetic rounds with every kind of retained-row value: absent rows (NaN), a zeroed continuation entry
    (-inf) and absent ages and counts."""
    import pyarrow as pa

    table, manifest = synthetic_rounds(12, 20, topk=6, depth=3, expand=4, seed=5)
    frame = table.to_pandas()
    for i in range(0, len(frame), 7):
        frame.at[i, "cache_logp"] = np.full(6, np.nan, np.float32)
        frame.at[i, "cache_age"] = -1
    for i in range(3, len(frame), 5):
        row = np.array(frame.at[i, "preceding_logp"], np.float32)
        row[i % 6] = -np.inf
        row[(i + 1) % 6] = np.nan
        frame.at[i, "preceding_logp"] = row
        frame.at[i, "prev_tree_root_token_count"] = -1
    table = pa.Table.from_pandas(frame, preserve_index=False)
    return table, featurize_rounds(table, manifest)


def test_first_step_features_on_the_device_equal_the_offline_kernels(recorded):
    from specrank.engines.device.first_token import first_step_features
    from specrank.featurize.sets import FIRST_STEP

    table, features = recorded
    got = first_step_features(first_step_inputs(table, features))
    checked = [f for f in FIRST_STEP if f not in ("token_prior", "task")]
    assert set(got) == set(checked)
    for name in checked:  # float64 sums in candidate order; log and exp may differ from libm's by an ulp
        np.testing.assert_allclose(got[name].reshape(-1).numpy(), features[name].to_numpy(np.float64), rtol=1e-14,
                                   atol=0, equal_nan=True, err_msg=name)
    assert np.isnan(features["cache_logp"]).any() and np.isinf(features["preceding_logp"]).any()


def test_a_first_step_reranker_chooses_on_the_device_what_it_predicts_offline(recorded):
    from specrank.engines.device.first_token import DeviceReranker, DeviceRerankerError, HostReranker
    from specrank.featurize.engine import engine_visible

    table, features = recorded
    for objective in ("pointwise", "lambdarank"):
        model = GBMReranker(features="first_step", n_estimators=40, num_leaves=7, min_child_samples=5, n_jobs=1,
                            objective=objective).fit(features)
        device = DeviceReranker(model, vocab_size=int(features["token"].max()) + 1)
        got = device.probabilities(first_step_inputs(table, features)).reshape(-1).numpy()
        unknown = engine_visible(features)["task"]  # the engine knows no task (its own rows: the table's)
        expected = model.predict(features.assign(task=unknown))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
        chosen = device.choose(first_step_inputs(table, features)).numpy()
        assert (chosen == expected.reshape(-1, 6).argmax(axis=1)).all()
        host = HostReranker(model)  # the CPU's path: the decoder's round kernel
        np.testing.assert_allclose(host.probabilities(first_step_inputs(table, features)).reshape(-1), expected,
                                   rtol=0, atol=1e-12)
        assert (host.choose(first_step_inputs(table, features)).numpy() == chosen).all()
    rows = GBMReranker(features="rows", n_estimators=5, n_jobs=1).fit(features)
    with pytest.raises(DeviceRerankerError, match="subtree|child_max_q|first draft step"):
        DeviceReranker(rows, vocab_size=1000)
    with pytest.raises(DeviceRerankerError, match="subtree|child_max_q|first draft step"):
        HostReranker(rows)


@pytest.mark.parametrize("host", [False, True], ids=["tensors", "kernels"])
def test_retained_rows_on_the_device_read_as_the_decoders_caches_do(host):
    """Two requests decoding chains side by side: each step's reads from ``DeviceRows`` (tensor operations, or the
    CPU's numba kernels) equal those of specrank's ``RowCaches`` driven with the same verify passes (repeated
    tokens, a continuation equal to the root or to a drafted token, absent rows); a ring of too few rows drops the
    oldest token (a negative control), the same way on both paths."""
    from specrank.decode.engine.caches import RowCaches
    from specrank.engines.device.rows import DeviceRows

    v, k, steps, temperature = 40, 3, 30, 0.7
    gen = torch.Generator().manual_seed(0)
    device, small = DeviceRows(3, 64, v, temperature, host=host), DeviceRows(3, k + 1, v, temperature, host=host)
    other = DeviceRows(3, k + 1, v, temperature, host=not host)  # the other path, wrapping its ring as often
    caches = [RowCaches(v, temperature), RowCaches(v, temperature)]
    slot = torch.tensor([2, 0])
    for rows in (device, small, other):
        rows.reset(slot)
    root = torch.randint(0, 8, (2,), generator=gen)
    differs = False
    for step in range(steps):
        candidates = torch.randint(0, 8, (2, 5), generator=gen)
        values, age, count = device.read(slot, root, candidates)
        for b, c in enumerate(caches):
            rows, index, want_age, want_count = c.gather(step, int(root[b]), candidates[b].numpy())
            want = rows[:, index[:5]]
            np.testing.assert_allclose(values[b].numpy(), want, rtol=1e-6, atol=1e-6, equal_nan=True)
            assert [age[b].item(), count[b].item()] == [x if x >= 0 else pytest.approx(np.nan, nan_ok=True)
                                                        for x in (want_age, want_count)]
        few = small.read(slot, root, candidates)
        differs |= not torch.allclose(few[0], values, equal_nan=True)
        for got, want in zip(few, other.read(slot, root, candidates)):
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
        chain = torch.randint(0, 8, (2, k), generator=gen)  # small vocabulary: repeats and hits are frequent
        tokens = torch.cat([root[:, None], chain], dim=1)
        logits = torch.randn(2, k + 1, v, generator=gen)
        accepted = torch.randint(0, k + 1, (2,), generator=gen)
        continuation = torch.where(torch.rand(2, generator=gen) < 0.3, root, torch.randint(0, 8, (2,), generator=gen))
        for b, c in enumerate(caches):
            c.update(step, int(root[b]), logits[b], 0, chain[b].numpy(), np.arange(1, k + 1), int(accepted[b]),
                     int(continuation[b]), -1)
        for rows in (device, small, other):
            rows.update(slot, rows.log_probabilities(logits), tokens, accepted, continuation)
        root = continuation
    assert differs  # k + 1 rows a request cannot hold what eight tokens stored
    for name in ("store", "slot_of", "token_of", "round_of", "state"):
        assert torch.equal(getattr(small, name).nan_to_num(), getattr(other, name).nan_to_num()), name
    assert device.nbytes < 3 * 73 * v * 4 + 3 * (v + 1 + 2 * 73 + 7) * 8 + 1000


class HostReads:
    """Counts the calls that make the host wait for a device (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``
    and ``int`` / ``float`` / ``bool`` of a tensor) while ``inside``."""

    WAITS = ("item", "cpu", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, monkeypatch):
        self.inside, self.count = False, 0
        for name in self.WAITS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)))

    def counted(self, fn):
        def call(*args, **kwargs):
            self.count += self.inside
            return fn(*args, **kwargs)
        return call


@pytest.mark.parametrize("reads", [False, True], ids=["as-shipped", "negative-control"])
def test_a_chain_step_on_the_device_path_reads_nothing_on_the_host(monkeypatch, reads):
    """The plugin's steps as a GPU runs them (the tensor path): a choice, the rows' log-probabilities and their
    retention, for three requests over 12 steps, with no host read; a step that reads a value is counted."""
    from specrank.engines.vllm.chooser import ChainChooser

    features = featurize_rounds(*synthetic_rounds(12, 20, topk=6, depth=3, expand=4, seed=5))
    model = GBMReranker(features="first_step", n_estimators=20, num_leaves=7, min_child_samples=5, n_jobs=1).fit(features)
    v, k, gen = 50, 3, torch.Generator().manual_seed(1)
    chooser = ChainChooser(model, v, 1.0, requests=4, rows=16, host=False)
    ids = ["a", "b", "c"]
    chooser.slots_of(ids)  # a request's first step finds it a slot: host bookkeeping of the engine's request ids
    counter = HostReads(monkeypatch)
    root = torch.randint(0, v, (3,), generator=gen)
    for step in range(12):
        counter.inside = True
        first = chooser.choose(ids, torch.randn(3, v, generator=gen), root, torch.full((3,), 9.0),
                               torch.full((3,), float(step)))
        if reads:
            first.sum().item()
        logp = chooser.log_probabilities(torch.randn(3, k + 1, v, generator=gen))
        tokens = torch.cat([root[:, None], first[:, None], torch.randint(0, v, (3, k - 1), generator=gen)], dim=1)
        continuation = torch.randint(0, v, (3,), generator=gen)
        chooser.retain(ids, logp, tokens, torch.randint(0, k + 1, (3,), generator=gen), continuation)
        counter.inside = False
        root = continuation
    assert counter.count == (12 if reads else 0)
