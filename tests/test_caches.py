import numpy as np
import torch

from specrank.decode.engine.caches import RowCaches, TokenRows, latest_unique, prompt_positions, tv_and_agree

V = 10


def _rows(n, seed):
    return torch.log_softmax(torch.randn(n, V, generator=torch.Generator().manual_seed(seed)), -1)


def _tv(a, b):
    return 0.5 * float((a.exp() - b.exp()).abs().sum())


def test_hand_built_sequence_reads_the_rows_spec_names():
    prompt = np.array([1, 2, 1, 3])
    P, R, T, E = _rows(4, 0), _rows(3, 1), _rows(4, 2), _rows(1, 3)[0]
    c = RowCaches(V)
    c.seed(prompt, P)  # latest occurrence: 1 -> P[2], 2 -> P[1], 3 -> P[3]

    r0 = c.read(0, root_token=1, first_tokens=np.array([1, 3, 5]), root_row=R[0])
    np.testing.assert_allclose(r0["cache_logp"], P[2][[1, 3, 5]].numpy(), rtol=1e-6)
    assert r0["cache_age"] == 1 and r0["prev_tree_root_token_count"] == -1
    assert np.isnan(r0["same_token_logp"]).all() and np.isnan(r0["preceding_logp"]).all()
    assert np.isnan(r0["matched_tv"]) and abs(r0["token_tv"] - _tv(P[2], R[0])) < 1e-6

    # round 0: tree in rank order ends in 5, 6, 5, 7; last accepted node's row T[1]; continuation 5
    rows = torch.cat([R[:1], T, E[None]])  # the pass: root, four tree prefixes, the emitted address
    c.update(0, 1, rows, 0, np.array([5, 6, 5, 7]), np.arange(1, 5), last_accepted=2, continuation=5, emitted=5)
    r1 = c.read(1, root_token=5, first_tokens=np.array([5, 6, 2]), root_row=R[1])
    np.testing.assert_allclose(r1["cache_logp"], T[0][[5, 6, 2]].numpy(), rtol=1e-6)  # highest-ranked prefix ending in 5
    np.testing.assert_allclose(r1["same_token_logp"], T[0][[5, 6, 2]].numpy(), rtol=1e-6)
    assert np.isnan(r1["preceding_logp"][0])  # the continuation's entry is zeroed -> missing
    np.testing.assert_allclose(r1["preceding_logp"][1:], T[1][[6, 2]].numpy(), rtol=1e-6)
    assert r1["cache_age"] == 1 and r1["prev_tree_root_token_count"] == 2
    assert abs(r1["matched_tv"] - _tv(E, R[1])) < 1e-6
    assert r1["matched_argmax_agree"] == float(E.argmax() == R[1].argmax())

    # round 1: the root token equals the continuation -> the root row is the same-token row
    c.update(1, 5, torch.cat([R[1:2], T[2:]]), 0, np.array([8, 1]), np.array([1, 2]), last_accepted=0, continuation=5,
             emitted=-1)
    r2 = c.read(2, root_token=5, first_tokens=np.array([1, 4]), root_row=R[2])
    np.testing.assert_allclose(r2["cache_logp"], R[1][[1, 4]].numpy(), rtol=1e-6)  # root stored after the tree
    np.testing.assert_allclose(r2["same_token_logp"], R[1][[1, 4]].numpy(), rtol=1e-6)
    assert r2["prev_tree_root_token_count"] == 1 and np.isnan(r2["matched_tv"])
    np.testing.assert_allclose(c.read(2, 1, np.array([0]), R[2])["cache_logp"], T[3][[0]].numpy(), rtol=1e-6)  # 1 -> tree row

    # a prompt token never overwritten keeps its prompt row, and its age grows
    r3 = c.read(3, root_token=2, first_tokens=np.array([0]), root_row=R[2])
    np.testing.assert_allclose(r3["cache_logp"], P[1][[0]].numpy(), rtol=1e-6)
    assert r3["cache_age"] == 4
    assert c.read(3, 9, np.array([0]), R[2])["cache_age"] == -1  # never seen


def test_token_rows_grow_and_overwrite():
    store = TokenRows(V, block=2)
    rows = _rows(6, 4)
    store.put(np.array([0, 1, 2]), rows[:3], 0)
    store.put(np.array([2, 3, 4]), rows, 1, index=np.array([3, 4, 5]))
    assert torch.equal(store.get(2)[0], rows[3]) and store.get(2)[1] == 1
    assert torch.equal(store.get(0)[0], rows[0]) and store.get(5) == (None, -1)


def test_helpers():
    np.testing.assert_array_equal(np.sort(latest_unique(np.array([4, 4, 2, 4, 2]))), [3, 4])
    r = _rows(1, 5)[0]
    assert tv_and_agree(r, r) == (0.0, 1.0)


def test_rows_read_from_the_prepared_block_equal_the_whole_pass_log_softmax_to_rounding():
    """Each read is ``row[x] / T - logsumexp(row / T)``, the block built once per root token: bit for bit that
    arithmetic, and within float32 rounding of the whole pass's log-softmax."""
    logits = torch.randn(12, 4096, generator=torch.Generator().manual_seed(7)) * 4
    whole = torch.log_softmax(logits / 0.7, -1)
    c = RowCaches(4096, temperature=0.7)
    c.seed(np.arange(12) % 5, logits)  # tokens 0..4; latest occurrences at rows 10, 11, 7, 8, 9
    first = np.array([3, 17, 4000, 0])
    for token, row in ((0, 10), (1, 11), (2, 7), (3, 8), (4, 9)):
        for _ in range(2):  # the second read gathers from the same block
            got = c.read(0, token, first)["cache_logp"]
            scaled = logits[row] / 0.7
            np.testing.assert_array_equal(got, (scaled - torch.logsumexp(scaled[None], -1)).numpy()[first])
            np.testing.assert_allclose(got, whole[row][first].numpy(), rtol=0, atol=4e-6)  # an ulp of the normalizer
    c.token_rows.put(np.array([2]), logits, 1, np.array([0]))  # a store after the block was built
    c.prepared = None  # (update and seed drop the block; a bare put is this test's)
    np.testing.assert_allclose(c.read(1, 2, first)["cache_logp"], whole[0][first].numpy(), rtol=0, atol=4e-6)


def test_seeding_the_latest_occurrences_keeps_the_prefill_rows_without_a_copy():
    """A prefill computes the rows of each token's latest occurrence only (``prompt_positions``); the store keeps
    that tensor as its first block, and later stores overwrite its rows or grow past it as for any block."""
    prompt = np.array([4, 1, 2, 1, 3, 4])
    full = _rows(6, 5)
    kept = prompt_positions(prompt)
    assert kept.tolist() == [2, 3, 4, 5]  # 2, 1, 3, 4 at their latest occurrences
    rows = full[kept].clone()
    adopted, copied = RowCaches(V), RowCaches(V)
    adopted.seed(prompt, rows, kept)
    copied.seed(prompt, full)  # every position: the latest occurrences are copied out
    assert adopted.token_rows.blocks[0].data_ptr() == rows.data_ptr()
    for token in (1, 2, 3, 4, 0):
        a, b = adopted.token_rows.get(token), copied.token_rows.get(token)
        assert a[1] == b[1]
        assert (a[0] is None) == (b[0] is None) and (a[0] is None or torch.equal(a[0], b[0]))
    store = adopted.token_rows
    store.block = 2
    later = _rows(4, 6)
    store.put(np.array([1, 7, 8, 9]), later, 3)  # 1 leaves its prompt row; 1, 7, 8, 9 fill two new blocks
    assert torch.equal(store.get(1)[0], later[0]) and store.get(1)[1] == 3
    for token, row in ((7, 1), (8, 2), (9, 3)):
        assert torch.equal(store.get(token)[0], later[row])
    assert torch.equal(store.get(2)[0], full[2]) and len(store.blocks) == 3
