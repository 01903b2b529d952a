"""The vLLM plugin's work without vLLM (``specrank.engines.vllm.chooser``): a chain engine emulated beside
specrank's recorder. At each first draft step the chooser's features equal the offline featurizer's on the same
rounds, as an engine sees them; it keeps its rows from the verified chain's rows only; and a reranker picks the
first token there as it does offline."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.runs.measure import Measure
from specrank.decode.runs.tables import rounds_table
from specrank.decode.strategies import StaticTreeSelection
from specrank.engines.device.first_token import first_step_features
from specrank.engines.vllm.chooser import ChainChooser, ChooserError
from specrank.featurize import featurize_rounds
from specrank.featurize.engine import engine_visible
from specrank.featurize.sets import FIRST_STEP
from specrank.rerankers import GBMReranker
from specrank.selection import StaticTree
from decode_helpers import decode_prompt_online, tiny_pair

K, STEPS = 4, 2
SHAPE = PoolShape(K, STEPS, K, children=1)
CONFIG = DecodeConfig(SHAPE, budget=STEPS, extra=0, temperature=0.0, max_new_tokens=24)
CHAIN = StaticTreeSelection(StaticTree((1,) * STEPS))
MANIFEST = {"temperature": 0.0, "topk": K}
PROMPTS = [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i] for i in range(8)]


@dataclass
class ChainEngineEmulator(Measure):
    """specrank's recorder, and beside it the chooser fed each round as a chain engine would feed it: the head's
    root row before the first draft step, then the verified chain's target rows."""

    chooser: ChainChooser | None = None
    seen: dict = field(default_factory=dict)  # (prompt, round) -> the chooser's features
    picked: dict = field(default_factory=dict)  # (prompt, round) -> the token it chose

    def observe(self, view) -> dict:
        record = super().observe(view)  # the recorded round, read before the round's rows are retained
        st, pool = view.state, view.pool
        head_row = torch.log(torch.as_tensor(pool.q_root, dtype=torch.float32))[None]  # -inf outside the head
        rid, root = [st.prompt_id], torch.tensor([st.root])
        x = self.chooser.inputs(rid, head_row, root, [len(st.prompt_ids)], [len(st.output)])
        self.seen[(st.prompt_id, st.rounds)] = {k: v[0].numpy() for k, v in first_step_features(x).items()}
        self.picked[(st.prompt_id, st.rounds)] = int(torch.gather(x.token, 1, self.chooser.scorer.choose(x)[:, None]))
        chain = np.flatnonzero(view.tree)  # the verified chain, in pool (depth) order
        rows = view.logits[torch.as_tensor([0] + [int(view.scored.row_of[c]) for c in chain])]
        tokens = torch.as_tensor(np.concatenate([[st.root], pool.token[chain]]))[None]
        self.chooser.retain(rid, self.chooser.log_probabilities(rows[None]), tokens, torch.tensor([len(view.accepted)]),
                            torch.tensor([int(view.continuation)]))
        return record


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


@pytest.fixture(scope="module")
def reranker(pair):
    records = []
    for i, ids in enumerate(PROMPTS[:4]):
        records += decode_prompt_online(*pair, ids, CONFIG, CHAIN, prompt_id=f"t{i}", task="t",
                                        measure=Measure(record=True))[1]
    features = featurize_rounds(rounds_table(records, SHAPE.size, K), MANIFEST)
    return GBMReranker(features="first_step", n_estimators=30, num_leaves=7, min_child_samples=3, n_jobs=1).fit(features)


@pytest.fixture(scope="module", params=[True, False], ids=["host", "device"])
def emulated(pair, reranker, request):
    """The chooser scoring on the host (the CPU's round kernel) or with the device path's tensors."""
    target, _ = pair
    chooser = ChainChooser(reranker, target.vocab_size, 0.0, rows=64, host=request.param)
    observer = ChainEngineEmulator(record=True, chooser=chooser)
    records = []
    for i, ids in enumerate(PROMPTS[4:]):
        records += decode_prompt_online(*pair, ids, CONFIG, CHAIN, prompt_id=f"p{i}", task="t", measure=observer)[1]
    return featurize_rounds(rounds_table(records, SHAPE.size, K), MANIFEST, labels=False), observer


def test_the_choosers_features_equal_the_offline_featurizers_as_an_engine_sees_them(emulated):
    offline, observer = emulated
    offline = engine_visible(offline)
    keys = list(zip(offline["prompt_id"].astype(str)[::K], offline["round"][::K]))
    assert len(keys) == len(observer.seen) >= 20
    names = [f for f in FIRST_STEP if f not in ("token_prior", "task")]
    for name in names:
        got = np.concatenate([observer.seen[k][name] for k in keys])
        np.testing.assert_allclose(got, offline[name].to_numpy(np.float64), rtol=2e-6, atol=1e-6, equal_nan=True,
                                   err_msg=name)
    assert offline["same_token_logp"].notna().any() and offline["cache_logp"].notna().any()
    assert (offline["cache_age"] == offline["round"] + 1).sum() == 0  # no prompt row reaches the engine


def test_the_chooser_picks_the_first_token_the_reranker_ranks_first_offline(emulated, reranker):
    offline, observer = emulated
    seen = engine_visible(offline)
    probabilities = reranker.predict(seen).reshape(-1, K)
    tokens = seen["token"].to_numpy().reshape(-1, K)
    keys = list(zip(seen["prompt_id"].astype(str)[::K], seen["round"][::K]))
    offline_pick = tokens[np.arange(len(tokens)), probabilities.argmax(axis=1)]
    agree = np.mean([observer.picked[k] == t for k, t in zip(keys, offline_pick)])
    assert agree >= 0.95  # float32 re-normalised head rows may reorder a near tie
    assert (offline_pick != tokens[:, 0]).any()  # the reranker does move some first tokens off the head's argmax


def test_a_reranker_of_another_law_is_refused(reranker, pair):
    with pytest.raises(ChooserError, match="temperature 1"):
        ChainChooser(reranker, pair[0].vocab_size, temperature=1.0)


def test_the_plugins_settings_and_its_refusals_are_one_line_each():
    from importlib.metadata import entry_points

    from specrank.engines.vllm.plugin import PINNED, PluginVersionError, check_version, settings

    assert settings({}) == {"source": "", "temperature": 0.0, "requests": 16, "rows": 64}
    assert settings({"SPECRANK_RERANKER": " r ", "SPECRANK_VLLM_ROWS": "8"})["rows"] == 8
    for name, value in (("SPECRANK_VLLM_ROWS", "1"), ("SPECRANK_TEMPERATURE", "hot"), ("SPECRANK_VLLM_REQUESTS", "0")):
        with pytest.raises(ValueError, match=name) as err:
            settings({name: value})
        assert "\n" not in str(err.value)
    check_version(PINNED)
    with pytest.raises(PluginVersionError, match=f"wraps vLLM {PINNED}, not 0.33.0") as err:
        check_version("0.33.0")
    assert "\n" not in str(err.value)
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("specrank") == "specrank.engines.vllm.plugin:register"  # vLLM finds it where it looks


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_plugins_default_reranker_is_a_shipped_first_step_one_for_each_law(temperature):
    """``reranker:default`` in the plugin: the shipped first-step reranker of the law, which the device path scores
    (the study's champions read the subtree, which it refuses), its card naming the prompts it learned from."""
    from specrank.engines.device.first_token import DeviceReranker, DeviceRerankerError
    from specrank.law import Law
    from specrank.rerankers.defaults import load_default_reranker, load_first_step_reranker

    reranker = load_first_step_reranker(temperature)
    assert set(reranker.features_) <= set(FIRST_STEP) and reranker.topk_ == 10
    assert reranker.label_kind_ == Law(temperature).label_kind
    assert len(reranker.card_["training_prompts"]) == reranker.card_["prompts"] == 160
    DeviceReranker(reranker, vocab_size=49152)
    with pytest.raises(DeviceRerankerError, match="first draft step"):
        DeviceReranker(load_default_reranker(temperature), vocab_size=49152)


def test_the_plugin_switched_off_passes_vllms_calls_through(monkeypatch):
    """``plugin.set_active(False)`` (a benchmark's plugin-off turns, in one engine): the wrapped draft step returns
    vLLM's own token and the wrapped sampler keeps no rows; on again, the chooser is asked."""
    from types import SimpleNamespace

    from specrank.engines.vllm import hooks
    from specrank.engines.vllm.plugin import set_active

    asked = []
    chooser_of = lambda vocab, device: asked.append(vocab) or SimpleNamespace(  # noqa: E731
        log_probabilities=lambda logits: logits, choose=lambda *a: torch.tensor([7]))
    greedy = hooks.around_greedy_sample(lambda self, hidden: torch.tensor([3]), chooser_of)
    sample = hooks.around_sample(lambda self, logits, meta, *a, **k: "vllm's", chooser_of)
    proposer = SimpleNamespace(model=SimpleNamespace(compute_logits=lambda h: torch.zeros(1, 11)))
    runner = SimpleNamespace(input_batch=SimpleNamespace(num_prompt_tokens=np.array([4]), req_ids=["r"],
                                                         num_tokens_no_spec=np.array([5])))
    meta = SimpleNamespace(num_draft_tokens=[2])
    monkeypatch.setattr(hooks, "retain", lambda *a: asked.append("retained"))
    step = hooks._step.set(hooks.DraftStep(runner, torch.tensor([1]), torch.tensor([1.0])))
    try:
        set_active(False)
        assert int(greedy(proposer, None)[0]) == 3 and sample(None, torch.zeros(3, 11), meta) == "vllm's"
        assert asked == []
        set_active(True)
        assert int(greedy(proposer, None)[0]) == 7 and sample(None, torch.zeros(3, 11), meta) == "vllm's"
        assert asked == [11, 11, "retained"]
    finally:
        set_active(True)
        hooks._step.reset(step)
