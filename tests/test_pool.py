"""Pool growth (docs/design.md): counts, order, ancestor closure, expansion choice, exactness vs sequential drafting."""

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specrank.decode.loading.drafters import load_drafter
from specrank.decode.loading.targets import load_target
from specrank.decode.core import Drafter, DraftPool, PoolShape, PoolShapeError, RootStep, draft_log_probs
from specrank.selection.select import ancestors
from specrank.testing import save_tiny_llama

torch.set_num_threads(1)


class TableDrafter(Drafter):
    """A drafter whose row depends only on (token, position): isolates the growth bookkeeping."""

    def __init__(self, vocab_size=128, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.table = torch.randn(vocab_size, vocab_size, generator=gen) * 3
        self.slope = torch.randn(vocab_size, generator=gen)
        self.calls = []

    def row(self, tokens, positions):
        return draft_log_probs(self.table[tokens] + positions[:, None].float() * self.slope)

    def _draft_root(self, root_token):
        return RootStep(self.row(torch.tensor([root_token]), torch.tensor([7]))[0], None, 8, 7)

    def _draft_step(self, tokens, positions, mask, feed):
        self.calls.append(len(tokens))
        assert mask.shape[0] == len(tokens)
        return self.row(tokens, positions), None

    def _rewind(self):
        pass


def reference_pool(drafter, root, shape):
    """Naive pool growth, one node at a time."""
    k = shape.topk
    row = drafter.row(torch.tensor([root]), torch.tensor([7]))[0].numpy()
    nodes = [dict(tok=int(t), parent=-1, depth=1, cum=row[t]) for t in np.argsort(-row, kind="stable")[:k]]
    frontier, expanded = list(range(k)), set()
    for d in range(1, shape.depth):
        expanded.update(frontier)
        new = []
        for i in frontier:
            r = drafter.row(torch.tensor([nodes[i]["tok"]]), torch.tensor([7 + nodes[i]["depth"]]))[0].numpy()
            for t in np.argsort(-r, kind="stable")[:k]:
                new.append(len(nodes))
                nodes.append(dict(tok=int(t), parent=i, depth=d + 1, cum=np.float32(nodes[i]["cum"] + r[t])))
        frontier = sorted(new, key=lambda i: (-nodes[i]["cum"], i))[: shape.expand]
    return nodes, expanded


def check_pool(pool: DraftPool, shape: PoolShape) -> None:
    """Every structural property docs/design.md requires of a pool; raises AssertionError."""
    m, k = shape.size, shape.topk
    idx = np.arange(len(pool))
    assert len(pool) == m and pool.expanded.sum() == shape.n_expanded
    assert (pool.first_ancestor == ancestors(pool.parent[None], pool.depth[None], 1)[0]).all()  # carried by growth
    assert (pool.depth[:k] == 1).all() and (np.diff(pool.draft_logp[:k]) <= 0).all()
    child = pool.parent >= 0
    assert (pool.parent < idx).all() and (child == (pool.depth > 1)).all()
    assert (pool.depth[child] == pool.depth[pool.parent[child]] + 1).all()
    n_children = np.bincount(pool.parent[child], minlength=m)
    assert (n_children == np.where(pool.expanded, k, 0)).all()
    cum = np.log(pool.q_edge.astype(np.float64))
    for _ in range(shape.depth):  # accumulate along paths
        cum = np.log(pool.q_edge.astype(np.float64)) + np.where(child, cum[np.maximum(pool.parent, 0)], 0)
    np.testing.assert_allclose(pool.draft_logp, cum, atol=1e-4)
    for d in range(2, shape.depth):  # expansion = top-expand new candidates by cumulative log-prob
        at = np.flatnonzero(pool.depth == d)
        best = at[np.argsort(-pool.draft_logp[at], kind="stable")[: shape.expand]]
        assert set(best) == set(np.flatnonzero(pool.expanded & (pool.depth == d)))
    rank = np.empty(m, int)
    rank[np.lexsort((idx, pool.depth, -pool.draft_logp))] = idx
    # Ancestor closure of every top-B set <=> each parent ranks before its child.
    assert (rank[pool.parent[child]] < rank[child]).all()


def test_shape_sizes():
    assert (PoolShape().size, PoolShape().n_expanded) == (710, 70)
    assert (PoolShape(3, 4, 2).size, PoolShape(3, 4, 2).n_expanded) == (3 + 9 + 6 + 6, 3 + 2 + 2)
    assert (PoolShape(4, 1, 4).size, PoolShape(4, 1, 4).n_expanded) == (4, 0)
    assert PoolShape(2, 3, 50).size == 2 + 4 + 8  # cannot expand more than were added
    with pytest.raises(PoolShapeError, match="depth"):
        PoolShape(depth=0)


@pytest.mark.parametrize("shape", [PoolShape(), PoolShape(3, 4, 2), PoolShape(5, 1, 5), PoolShape(2, 4, 9)])
def test_growth_matches_naive_reference(shape):
    drafter = TableDrafter()
    pool = drafter.grow_pool(11, shape)
    nodes, expanded = reference_pool(drafter, 11, shape)
    assert pool.token.tolist() == [n["tok"] for n in nodes]
    assert pool.parent.tolist() == [n["parent"] for n in nodes]
    assert pool.depth.tolist() == [n["depth"] for n in nodes]
    assert set(np.flatnonzero(pool.expanded)) == expanded
    np.testing.assert_allclose(pool.draft_logp, [n["cum"] for n in nodes], atol=1e-5)
    check_pool(pool, shape)
    assert drafter.calls == shape.level_sizes()[1][:-1]  # one forward per step over all expanded nodes
    np.testing.assert_allclose(pool.q_root.sum(), 1.0, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 12), st.integers(0, 3))
def test_growth_matches_reference_for_any_shape(topk, depth, expand, seed):
    shape, drafter = PoolShape(topk, depth, expand), TableDrafter(vocab_size=16, seed=seed)
    pool = drafter.grow_pool(5, shape)
    nodes, expanded = reference_pool(drafter, 5, shape)
    assert pool.parent.tolist() == [n["parent"] for n in nodes] and set(np.flatnonzero(pool.expanded)) == expanded
    check_pool(pool, shape)


def test_check_pool_rejects_corrupted_pools():
    """Negative controls: the checker catches a wrong expansion choice and a misordered first level."""
    shape = PoolShape()
    pool = TableDrafter().grow_pool(11, shape)
    at3 = np.flatnonzero(pool.depth == 3)
    swapped = DraftPool(**{f: getattr(pool, f).copy() for f in DraftPool.__dataclass_fields__})
    chosen, other = at3[swapped.expanded[at3]][0], at3[~swapped.expanded[at3]][0]
    swapped.expanded[[chosen, other]] = [False, True]
    with pytest.raises(AssertionError):
        check_pool(swapped, shape)
    misordered = DraftPool(**{f: getattr(pool, f).copy() for f in DraftPool.__dataclass_fields__})
    misordered.draft_logp[[0, 1]] = misordered.draft_logp[[1, 0]]
    with pytest.raises(AssertionError):
        check_pool(misordered, shape)
    lost = DraftPool(**{f: getattr(pool, f).copy() for f in DraftPool.__dataclass_fields__})
    lost.first_ancestor[at3[0]] = (lost.first_ancestor[at3[0]] + 1) % shape.topk  # a wrong depth-1 ancestor
    with pytest.raises(AssertionError):
        check_pool(lost, shape)


def test_bookkeeping_is_fast():
    drafter = TableDrafter(vocab_size=4096)
    drafter.grow_pool(3)
    start = time.perf_counter()
    for _ in range(5):
        drafter.grow_pool(3)
    per_pool = (time.perf_counter() - start) / 5
    assert per_pool < 0.25, per_pool  # a few ms when the machine is idle


@pytest.fixture(scope="module")
def target_and_drafter(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    target = load_target(save_tiny_llama(root / "t", seed=0))
    drafter = load_drafter(f"standalone:{save_tiny_llama(root / 'd', seed=1, num_layers=2)}", target)
    return target, drafter


def sequential_logp(model, ids):
    """Reference drafter row after ``ids`` by a plain causal forward without cache."""
    return torch.log_softmax(model(input_ids=torch.tensor(ids)[None]).logits[0, -1].float(), -1)


def test_standalone_pool_exact_vs_sequential(target_and_drafter):
    _, drafter = target_and_drafter
    context, root, shape = [4, 8, 15, 16, 23], 42, PoolShape()
    drafter.start(torch.tensor(context))
    pool = drafter.grow_pool(root, shape)
    check_pool(pool, shape)
    ref_root = sequential_logp(drafter.model, context + [root])
    np.testing.assert_allclose(pool.q_root, ref_root.exp().numpy(), atol=1e-6)
    assert pool.token[:10].tolist() == ref_root.topk(10).indices.tolist()
    for node in np.flatnonzero(pool.expanded)[::7]:  # a spread of expanded nodes at every depth
        path, cur = [], node
        while cur >= 0:
            path.insert(0, int(pool.token[cur]))
            cur = pool.parent[cur]
        ref = sequential_logp(drafter.model, context + [root] + path)
        kids = np.flatnonzero(pool.parent == node)
        assert pool.token[kids].tolist() == ref.topk(10).indices.tolist()
        np.testing.assert_allclose(np.log(pool.q_edge[kids]), ref.topk(10).values.numpy(), atol=2e-5)


def test_sibling_visible_mask_breaks_exactness(target_and_drafter, monkeypatch):
    """Negative control: a mask that lets tree nodes see their siblings changes the draft rows."""
    _, drafter = target_and_drafter
    context, root = [4, 8, 15, 16, 23], 42
    def see_everything(sees, visible):
        return torch.zeros(sees.shape[0], visible + sees.shape[1])

    monkeypatch.setattr(Drafter, "_tree_mask", staticmethod(see_everything))
    drafter.start(torch.tensor(context))
    pool = drafter.grow_pool(root, PoolShape(4, 2, 4))
    ref = sequential_logp(drafter.model, context + [root, int(pool.token[1])])
    kids = np.flatnonzero(pool.parent == 1)
    assert np.abs(np.log(pool.q_edge[kids]) - ref.topk(4).values.numpy()).max() > 1e-3


def test_commit_then_grow_equals_fresh_start(target_and_drafter):
    target, drafter = target_and_drafter
    context, shape = [4, 8, 15, 16, 23], PoolShape(4, 4, 3)
    drafter.start(torch.tensor(context))
    pool = drafter.grow_pool(42, shape)
    drafter.commit([42, int(pool.token[0])])
    after = drafter.grow_pool(50, shape)
    fresh = load_drafter(drafter.spec, target)
    fresh.start(torch.tensor(context + [42, int(pool.token[0])]))
    again = fresh.grow_pool(50, shape)
    assert after.token.tolist() == again.token.tolist()
    np.testing.assert_allclose(after.draft_logp, again.draft_logp, atol=2e-5)
    assert drafter.committed == len(context) + 2 and drafter.cache.get_seq_length() == drafter.committed


class MetaDrafter(Drafter):
    """Rows on the meta device, which holds no data: any host read of them raises."""

    vocab_size = 64

    def __init__(self):
        self.steps = 0

    def _draft_root(self, root_token):
        return RootStep(torch.empty(64, device="meta"), torch.empty(8, device="meta"), 5, 4)

    def _draft_step(self, tokens, positions, mask, feed):
        assert {tokens.device.type, positions.device.type, mask.device.type, feed.device.type} == {"meta"}
        self.steps += 1
        return torch.empty(len(tokens), 64, device="meta"), torch.empty(len(tokens), 8, device="meta")

    def _rewind(self):
        pass


def test_growth_reads_nothing_back_before_the_pool_is_finished():
    """Every drafting step runs without a host read (a sync on a GPU); only the finished pool is copied back."""
    drafter = MetaDrafter()
    with pytest.raises(NotImplementedError, match="meta"):
        drafter.grow_pool(1, PoolShape(4, 5, 3))
    assert drafter.steps == 4


def test_topk_larger_than_vocab_is_refused():
    with pytest.raises(PoolShapeError, match="exceeds"):
        TableDrafter(vocab_size=16).grow_pool(1, PoolShape(topk=20))
