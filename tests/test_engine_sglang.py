"""specrank's SGLang plugin without SGLang: trees in SGLang's tensor layout (``organize_draft_results``' score_list,
token_list and parents_list, built here from specrank's recorded beam rounds as ``select_top_k_tokens`` builds
them), the plugin's features against the offline featurizer's on the same rounds, its tree against tree-config's
``plugin`` score, negative controls, and one test that runs only where SGLang is importable."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.runs.measure import Measure
from specrank.decode.runs.tables import rounds_table
from specrank.decode.strategies import make_strategy
from specrank.decode.strategies.base import round_batch
from specrank.engines.sglang.plugin import settings
from specrank.engines.sglang.layout import draft_tree
from specrank.engines.sglang.rescorer import DraftRequest, PluginError, TreeRescorer
from specrank.engines.sglang.beam import beam_subpool
from specrank.engines.tree_settings import TreeSetting
from specrank.experiments.tree_config.setting_scores import PluginFactors, score_setting
from specrank.featurize import featurize_rounds
from specrank.featurize.engine import engine_visible
from specrank.featurize.features import GROUP_COLUMNS
from specrank.selection import PoolBatch, select_top
from decode_helpers import tiny_pair
from online_helpers import fitted_reranker

K, STEPS = 4, 3  # SGLang's --speculative-eagle-topk 4 --speculative-num-steps 3
SHAPE = PoolShape(K, STEPS, K)  # specrank's pool that grows SGLang's beam: 4 + 16 + 16 candidates
DRAFT_TOKENS = 8  # --speculative-num-draft-tokens, the root included: B = 7
CONFIG = DecodeConfig(SHAPE, budget=DRAFT_TOKENS - 1, extra=36, temperature=0.0, max_new_tokens=30)
MANIFEST = {"temperature": 0.0, "topk": K}
PROMPTS = [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i] for i in range(8)]
EXACT = ("q", "log_q", "sib_rank", "sib_top_q", "sib_gap", "sib_sum_q", "sib_entropy", "subtree_size",
         "subtree_expanded", "prompt_len", "position", "prev_accepted", "repeats_root", *GROUP_COLUMNS["rows"])
PRODUCTS = ("child_max_q", "child_entropy", "subtree_mass")  # read from SGLang's float32 products of q


def block(i: int) -> slice:
    """Flattened candidates of draft step i (0: the first level)."""
    return slice(0, K) if i == 0 else slice(K + (i - 1) * K * K, K + i * K * K)


def sglang_lists(sub: PoolBatch):
    """``organize_draft_results``' inputs for the rounds of a beam (``beam_subpool``, SGLang's flattened order):
    scores are float32 products of the draft factors, each step's from the one above, as ``select_top_k_tokens``
    multiplies them; ``parents_list[i]`` the k candidates of step i that step i + 1 expands, best first."""
    n = sub.n_rounds
    q, parent = torch.from_numpy(sub.q_edge.astype(np.float32)), torch.from_numpy(sub.parent)
    score = q.clone()
    for i in range(1, STEPS):
        cols = block(i)
        score[:, cols] = torch.gather(score, 1, parent[:, cols]) * q[:, cols]
    token = torch.from_numpy(sub.token)
    scores = [score[:, block(0)].view(n, 1, K)] + [score[:, block(i)].view(n, K, K) for i in range(1, STEPS)]
    tokens = [token[:, block(i)] for i in range(STEPS)]
    parents = [torch.arange(-1, K).expand(n, -1)]
    for i in range(1, STEPS):
        if i + 1 < STEPS:
            parents.append(parent[:, block(i + 1)][:, ::K])
        else:  # the last step's frontier is chosen but never expanded
            parents.append(torch.topk(score[:, block(i)], K).indices + block(i).start)
    return scores, tokens, parents


def paths(token: np.ndarray, parent: np.ndarray) -> list[tuple]:
    out: list[tuple] = []
    for t, p in zip(token, parent):
        out.append((*(out[p] if p >= 0 else ()), int(t)))
    return out


@dataclass
class SGLangEmulator(Measure):
    """specrank's recorder, and beside it the plugin fed each round as SGLang would feed it: the beam in SGLang's
    layout before verification (its features captured), then the verify pass's rows in SGLang's slot order."""

    rescorer: TreeRescorer | None = None
    seen: dict = field(default_factory=dict)  # (prompt, round) -> the plugin's features
    ranked: dict = field(default_factory=dict)  # (prompt, round) -> its first factors and the scores it hands SGLang

    def observe(self, view) -> dict:
        record = super().observe(view)  # the recorded round, read before the round's rows are retained
        batch = round_batch(view.pool, None, 1.0)
        sub, contained = beam_subpool(batch, K, STEPS)
        assert contained.all()
        tree = draft_tree(*sglang_lists(sub))
        st = view.state
        req = DraftRequest(st.prompt_id, st.root, len(st.prompt_ids), len(st.output))
        self.seen[(st.prompt_id, st.rounds)] = self.rescorer.features(tree, 0, req)
        self.ranked[(st.prompt_id, st.rounds)] = (self.rescorer.first_factor(tree, 0, req),
                                                  self.rescorer.score(tree, [req])[0])
        where = {p: i for i, p in enumerate(paths(view.pool.token, view.pool.parent))}
        col = np.array([where[p] for p in paths(sub.token[0], sub.parent[0])])  # sub position -> pool index
        chosen = np.flatnonzero(view.tree[col])  # SGLang's draft tokens: ascending flattened index
        self.rescorer.remember([req], chosen[None], sub.draft_logp.astype(np.float64))
        slot = {int(col[c]): 1 + j for j, c in enumerate(chosen)}
        rows = view.logits[torch.as_tensor([0] + [int(view.scored.row_of[col[c]]) for c in chosen])]
        accepted = np.array([0] + [slot[int(a)] for a in view.accepted])
        tokens = np.concatenate([[st.root], sub.token[0, chosen]])
        self.rescorer.retain(st.prompt_id, rows, tokens, accepted, view.continuation)
        return record


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


@pytest.fixture(scope="module")
def reranker(pair):
    from decode_helpers import decode_prompt_online

    records = []
    for i, ids in enumerate(PROMPTS[:4]):
        records += decode_prompt_online(*pair, ids, CONFIG, make_strategy("draft"), prompt_id=f"t{i}", task="t",
                                        measure=Measure(record=True))[1]
    return fitted_reranker("stacked", rounds_table(records, SHAPE.size, K), MANIFEST)  # rows GBM + per-depth


@pytest.fixture(scope="module")
def emulated(pair, reranker):
    """The held-out prompts decoded by specrank's recorder with the plugin beside it: (features table, the plugin's
    features by (prompt, round), rounds table, the plugin's first factors and scores by (prompt, round))."""
    from decode_helpers import decode_prompt_online

    observer = SGLangEmulator(record=True, rescorer=TreeRescorer(reranker, "test"))
    records = []
    for i, ids in enumerate(PROMPTS[4:]):
        records += decode_prompt_online(*pair, ids, CONFIG, make_strategy("draft"), prompt_id=f"p{i}", task="t",
                                        measure=observer)[1]
    table = rounds_table(records, SHAPE.size, K)
    return featurize_rounds(table, MANIFEST, labels=False), observer.seen, table, observer.ranked


def plugin_columns(seen: dict, offline, names) -> dict[str, np.ndarray]:
    """The plugin's features in the offline table's row order."""
    keys = zip(offline["prompt_id"].astype(str)[::K], offline["round"][::K])
    rounds = [seen[k] for k in keys]
    return {f: np.concatenate([r[f] for r in rounds]) for f in names}


def test_sglang_layout_reads_back_as_the_recorded_beam(emulated):
    table = emulated[2]
    sub, contained = beam_subpool(PoolBatch.from_frame(table.to_pandas()), K, STEPS)
    tree = draft_tree(*sglang_lists(sub))
    assert contained.all() and tree.score.shape == (sub.n_rounds, K + (STEPS - 1) * K * K)
    np.testing.assert_array_equal(tree.token, sub.token)
    np.testing.assert_array_equal(tree.parent, sub.parent)
    np.testing.assert_array_equal(np.broadcast_to(tree.depth, sub.shape), sub.depth)
    np.testing.assert_array_equal(tree.q_edge[:, :K], sub.q_edge[:, :K])  # the first level as drafted
    np.testing.assert_allclose(tree.q_edge, sub.q_edge, rtol=1e-6)  # deeper: a float32 product over its parent
    np.testing.assert_allclose(tree.draft_logp, sub.draft_logp, rtol=1e-5, atol=1e-6)


def test_the_plugins_features_equal_the_offline_featurizers_on_the_same_trees(emulated):
    offline, seen = emulated[:2]
    visible = engine_visible(offline)  # no prompt rows in an engine's caches, no task
    assert len(seen) == len(offline) // K >= 40
    got = plugin_columns(seen, visible, EXACT + PRODUCTS)
    for name in EXACT:
        np.testing.assert_array_equal(got[name], visible[name].to_numpy(np.float64), err_msg=name)
    for name in PRODUCTS:
        np.testing.assert_allclose(got[name], visible[name].to_numpy(np.float64), rtol=1e-5, err_msg=name)
    for source in ("cache", "same_token", "preceding"):  # every source of retained rows is read, not absent
        assert visible[f"{source}_logp"].notna().mean() > 0.1, source


def test_a_wrong_feature_or_ordering_is_caught(emulated, reranker):
    """Negative controls: the comparison above fails on the prompt's cache rows an engine has not got, and on a
    tree whose frontier is read in the wrong order."""
    offline, seen, table = emulated[:3]
    got = plugin_columns(seen, offline, ["cache_logp"])["cache_logp"]
    kept = offline["cache_logp"].to_numpy(np.float64)  # specrank's own decoder seeds the prompt's rows
    assert not np.array_equal(np.isnan(got), np.isnan(kept))
    sub, _ = beam_subpool(PoolBatch.from_frame(table.to_pandas()), K, STEPS)
    scores, tokens, parents = sglang_lists(sub)
    right, wrong = draft_tree(scores, tokens, parents), draft_tree(scores, tokens, [*parents[:1], parents[1].flip(1),
                                                                                    *parents[2:]])
    assert not np.array_equal(wrong.parent, sub.parent)
    rescorer = TreeRescorer(reranker, "test")
    mass = [(rescorer.features(t, b, DraftRequest("x", int(sub.token[b, 0]), 10, 1))["subtree_mass"]
             for t in (right, wrong)) for b in range(20)]
    assert any(not np.allclose(a, b) for a, b in mass)


def sglang_tree(score: np.ndarray) -> np.ndarray:
    """(N, C) bool: the candidates ``organize_draft_results`` keeps, its top-(n - 1) over the flattened scores."""
    index = torch.topk(torch.from_numpy(score), DRAFT_TOKENS - 1, dim=-1).indices.sort().values.numpy()
    chosen = np.zeros(score.shape, bool)
    np.put_along_axis(chosen, index, True, axis=1)
    return chosen


def test_sglangs_tree_with_the_plugin_is_what_tree_config_scores(emulated, reranker):
    """The plugin's first factors are the reranker's predictions on the engine's features, SGLang's top-(n - 1) over
    its scores is an ancestor-closed tree, and that tree's expected accepted tokens are tree-config's ``plugin``
    score of the same rounds, round by round."""
    offline, _, table, ranked = emulated
    pool = PoolBatch.from_frame(table.to_pandas())
    sub, _ = beam_subpool(pool, K, STEPS)
    keys = list(zip(offline["prompt_id"].astype(str)[::K], offline["round"][::K]))
    first = np.stack([ranked[k][0] for k in keys])
    np.testing.assert_allclose(first.ravel(), reranker.predict_first_factor(engine_visible(offline)), atol=1e-9)
    chosen = sglang_tree(np.stack([ranked[k][1] for k in keys]))
    has_parent = np.take_along_axis(chosen, np.maximum(sub.parent, 0), axis=1) | (sub.parent < 0)
    assert (has_parent | ~chosen).all()
    setting = TreeSetting(K, STEPS, DRAFT_TOKENS)
    plugin = score_setting(pool, "greedy", setting, plugin=PluginFactors(first, reranker.predict_deeper_factors))
    np.testing.assert_allclose(plugin.accepted["plugin"], np.where(chosen, sub.path_prob("greedy"), 0.0).sum(axis=1))
    draft = select_top(sub.draft_logp.astype(np.float64), sub.depth, DRAFT_TOKENS - 1)
    assert (chosen != draft).any(axis=1).mean() > 0.05  # the reranker moves trees: the check has power


def test_the_plugin_refuses_another_topk_and_the_wrong_law(reranker):
    rescorer = TreeRescorer(reranker, "test")
    wide = draft_tree([torch.rand(1, 1, 5)], [torch.arange(5)[None]], [torch.arange(-1, 5)[None]])
    with pytest.raises(PluginError, match="--speculative-eagle-topk 5"):
        rescorer.score(wide, [DraftRequest("r", 0, 4, 1)])
    with pytest.raises(PluginError, match="temperature 1"):
        TreeRescorer(reranker, "test", temperature=1.0)


def test_settings_come_from_the_environment_and_bad_ones_name_their_variable():
    assert settings({})["source"] == "" and settings({})["temperature"] == 0.0
    got = settings({"SPECRANK_RERANKER": "reranker:default", "SPECRANK_TEMPERATURE": "1", "SPECRANK_TASK": "qa"})
    assert (got["source"], got["temperature"], got["task"], got["capacity"]) == ("reranker:default", 1.0, "qa", 64)
    for name, value in (("SPECRANK_TEMPERATURE", "hot"), ("SPECRANK_TEMPERATURE", "-1"),
                        ("SPECRANK_SGLANG_REQUESTS", "0")):
        with pytest.raises(ValueError, match=name):
            settings({name: value})


def test_register_without_a_reranker_touches_nothing(monkeypatch):
    from specrank.engines.sglang.plugin import register

    monkeypatch.delenv("SPECRANK_RERANKER", raising=False)
    register()  # returns before importing SGLang, which is not installed here


@pytest.mark.engine
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed here")
def test_the_hooked_functions_exist_in_this_sglang_and_register_wraps_them(monkeypatch):
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry

    from specrank.engines.sglang import hooks
    from specrank.engines.sglang.plugin import register

    for target in (hooks.DRAFT, hooks.ORGANIZE, hooks.SAMPLE):
        assert callable(pkgutil.resolve_name(target)), target
    monkeypatch.setenv("SPECRANK_RERANKER", "reranker:default")
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    register()
    assert {hooks.DRAFT, hooks.ORGANIZE, hooks.SAMPLE} <= set(HookRegistry._hooks)


def test_retention_reads_eagle_sample_as_sglang_v0_5_18_returns_it():
    """``eagle_sample`` returns (predict, accept_lens, accept_index): accept_lens counts the root (its
    ``num_correct_drafts + 1``), accept_index holds global slots, root first, -1 padded. Each request's rows, tokens,
    local accepted slots and continuation must reach the rescorer (an accept_lens one past the path took the pad as
    its last slot). Negative control: SGLang's drafts-only count loses each request's last accepted slot."""
    from types import SimpleNamespace

    from specrank.engines.sglang.hooks import retain_batch

    class Recorder:
        def __init__(self):
            self.calls = []

        def retain(self, rid, rows, tokens, accepted, continuation):
            self.calls.append((rid, rows.clone(), tokens.copy(), accepted.tolist(), continuation))

    b, n, vocab = 2, 4, 11
    draft = torch.tensor([5, 6, 7, 8, 1, 2, 3, 4], dtype=torch.int64)
    logits = torch.randn(b * n, vocab)
    predict = torch.tensor([0, 0, 99, 0, 0, 0, 0, 77], dtype=torch.int32)
    accept_index = torch.tensor([[0, 2, -1, -1], [4, 5, 7, -1]], dtype=torch.int32)
    out = (predict, torch.tensor([2, 3], dtype=torch.int32), accept_index)
    verify = SimpleNamespace(draft_token_num=n, draft_token=draft)
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    rec = Recorder()
    retain_batch(rec, verify, batch, logits, out)
    (ra, rows_a, tok_a, acc_a, cont_a), (rb, rows_b, tok_b, acc_b, cont_b) = rec.calls
    assert (ra, acc_a, cont_a, tok_a.tolist()) == ("a", [0, 2], 99, [5, 6, 7, 8])
    assert (rb, acc_b, cont_b, tok_b.tolist()) == ("b", [0, 1, 3], 77, [1, 2, 3, 4])
    assert torch.equal(rows_a, logits[:n]) and torch.equal(rows_b, logits[n:])
    drafts_only = (predict, torch.tensor([1, 2], dtype=torch.int32), accept_index)  # num_correct_drafts alone
    wrong = Recorder()
    retain_batch(wrong, verify, batch, logits, drafts_only)
    assert [c[3] for c in wrong.calls] != [acc_a, acc_b]


def test_the_plugins_rows_read_as_the_decoders_bit_for_bit():
    """``RetainedRows`` (the plugin's CPU rows: each distinct row normalized once in a shared scratch block, the values
    subtracted at the candidates only) against ``RowCaches`` driven by the same verify passes: equal bit for bit at
    T = 1 with one thread and at T = 0.7 with two (a single row's sum split across threads would differ), through
    repeated tokens, a continuation equal to the root or to a verified token, a NaN row, an infinite logit, and a
    read of another root than the continuation."""
    from specrank.decode.engine.caches import RowCaches, TokenRows
    from specrank.engines.sglang.rows import BlockPool, RetainedRows, Scratch

    v, n = 40_000, 6  # above the size torch reduces on one thread
    gen, rng, threads = torch.Generator().manual_seed(0), np.random.default_rng(0), torch.get_num_threads()
    kinds = []
    try:
        for temperature, t in ((1.0, 1), (0.7, 2)):
            torch.set_num_threads(t)
            ref = RowCaches(v, temperature)
            ref.token_rows = TokenRows(v, 4)
            got = RetainedRows(v, temperature, Scratch(v), BlockPool(), 4)
            root = 3
            for r in range(14):
                rows = torch.randn(n, v, generator=gen) * 4
                rows[2] = float("nan") if r == 5 else rows[2]
                rows[0, 9] = float("inf") if r == 7 else rows[0, 9]
                tokens = rng.integers(0, 12, n - 1)  # repeated tokens, the root's among them
                tree = 1 + rng.permutation(n - 1)  # rank order
                continuation = (root, int(tokens[0]), int(rng.integers(12, 15)))[r % 3]
                kinds.append(r % 3)
                for c in (ref, got):
                    c.update(r, root, rows, 0, tokens, tree, int(tree[0]) if r % 2 else 0, continuation, -1)
                candidates = rng.integers(0, 15, 10)
                candidates[0] = continuation
                for read in (continuation, 4, continuation):
                    (a, ia, *rest_a), (b, ib, *rest_b) = (c.gather(r + 1, read, candidates) for c in (ref, got))
                    assert np.array_equal(a[:, ia], b[:, ib], equal_nan=True) and rest_a == rest_b, (r, read)
                root = continuation
    finally:
        torch.set_num_threads(threads)
    assert set(kinds) == {0, 1, 2}


def test_a_finished_requests_row_blocks_serve_the_next_request(reranker):
    """A request whose ``Req`` SGLang has let go is dropped when the next request arrives, and its token rows' blocks
    serve that request (new memory costs a page fault per 4 KB); a request SGLang still holds keeps its rows."""
    class Req:
        pass

    rescorer = TreeRescorer(reranker, "test")
    rows, held = torch.randn(5, 300), Req()
    first = rescorer.state("a", held)
    first.caches = rescorer.new_caches(rows)
    first.caches.update(0, 1, rows, 0, np.array([5, 6, 7, 8]), np.arange(1, 5), 0, 9, -1)
    blocks = [blk.data_ptr() for blk in first.caches.token_rows.blocks]
    rescorer.state("b", Req())  # its Req is let go at once
    assert "a" in rescorer.states and not rescorer.pool.free
    del held
    nxt = rescorer.state("c", Req())
    assert list(rescorer.states) == ["c"] and [blk.data_ptr() for blk in rescorer.pool.free] == blocks
    nxt.caches = rescorer.new_caches(rows)
    nxt.caches.update(0, 2, rows, 0, np.array([5, 6, 7, 8]), np.arange(1, 5), 0, 9, -1)
    assert [blk.data_ptr() for blk in nxt.caches.token_rows.blocks] == blocks and not rescorer.pool.free
