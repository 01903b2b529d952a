import numpy as np
import pytest
import torch

from specrank.decode.engine.tree import TreeError, ancestor_matrix, attention_mask, scored_set
from specrank.testing import tiny_llama

# pool: 0,1 at depth 1; 2,3 children of 0; 4 child of 1; 5 child of 2; 6 child of 3
TOKEN = np.array([10, 11, 12, 13, 14, 15, 16])
PARENT = np.array([-1, -1, 0, 0, 1, 2, 3])
DEPTH = np.array([1, 1, 2, 2, 2, 3, 3])
EXPANDED = np.array([1, 1, 1, 1, 0, 0, 0], dtype=bool)


def _set(tree_idx, rank, extra, ctx=5):
    tree = np.zeros(7, dtype=bool)
    tree[tree_idx] = True
    return scored_set(9, TOKEN, PARENT, DEPTH, EXPANDED, tree, np.asarray(rank), extra, ctx)


def test_order_rows_positions_and_ancestors():
    s = _set([0, 2], rank=[0, 2, 5, 1, 3, 4, 6], extra=3)
    # root, tree (0, 2), expanded not in tree (1, 3), extra top-3 not yet included (5)
    np.testing.assert_array_equal(s.pool_index, [-1, 0, 2, 1, 3, 5])
    np.testing.assert_array_equal(s.row_of, [1, 3, 2, 4, -1, 5, -1])
    np.testing.assert_array_equal(s.parent_row, [-1, 0, 1, 0, 1, 2])
    assert s.n_tree == 2
    np.testing.assert_array_equal(s.input_ids, [9, 10, 12, 11, 13, 15])
    np.testing.assert_array_equal(s.position_ids, [5, 6, 7, 6, 7, 8])
    anc = s.ancestors.numpy()
    np.testing.assert_array_equal(np.flatnonzero(anc[5]), [0, 1, 2, 5])  # 15 <- 12 <- 10 <- root
    np.testing.assert_array_equal(np.flatnonzero(anc[3]), [0, 3])
    assert anc.sum() == 6 + 5 + 2 + 2  # self, root, then rows 2, 4 (row 1) and row 5 (rows 1, 2)


def test_not_ancestor_closed_raises():
    with pytest.raises(TreeError, match="parent of pool candidate 4"):
        scored_set(9, TOKEN, PARENT, DEPTH, np.zeros(7, bool), np.eye(7, dtype=bool)[4], np.arange(7), 0, 5)


@pytest.mark.parametrize("device", [None, "cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_mask_is_additive_zero_or_minus_inf(device):
    anc = ancestor_matrix(np.array([-1, 0, 1]), 2)
    mask = attention_mask(anc, 2, device=device)  # built where the target runs (the host by default)
    assert mask.device.type == (device or "cpu")
    mask = mask.cpu()
    assert mask.shape == (3, 5) and mask.dtype == torch.float32
    assert (mask[:, :2] == 0).all()
    assert torch.equal(mask[:, 2:] == 0, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    assert torch.isinf(mask[0, 3]) and mask[0, 3] < 0


def test_tree_rows_equal_plain_forward_on_each_prefix():
    """Every pass row equals a plain forward on that prefix's full context (HF 4D mask contract)."""
    from transformers import DynamicCache

    from specrank.decode.loading.target_passes import cache_keyword

    model = tiny_llama(vocab_size=64)
    ctx = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    s = _set([0, 1, 2, 4], rank=[0, 1, 2, 3, 4, 5, 6], extra=7)
    cache = {cache_keyword(): DynamicCache()}
    with torch.no_grad():
        model(ctx, **cache, use_cache=True)
        out = model(s.input_ids[None], attention_mask=attention_mask(s.ancestors, 5)[None, None],
                    position_ids=s.position_ids[None], **cache, use_cache=True).logits[0]
        for i in range(s.n):
            seq = torch.cat([ctx[0], s.input_ids[s.ancestors[i]]])  # ancestors precede in row order
            ref = model(seq[None]).logits[0, -1]
            assert (torch.softmax(ref, -1) - torch.softmax(out[i], -1)).abs().max() < 1e-5
