"""Drafters: spec parsing, tokenizer checks, early exit (+ exit head and its command), EAGLE-3 heads."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specrank.cli import main
from specrank.decode.loading.drafters import load_drafter
from specrank.decode.loading.early_exit import (
    ExitHeadError,
    exit_regression_data,
    fit_exit_head,
    save_exit_head,
    solve_exit_head,
)
from specrank.decode.loading.standalone import TokenizerMismatchError
from specrank.decode.loading.targets import load_target
from specrank.decode.core import ModelLoadError, PoolShape, causal_mask
from specrank.testing import WORDS, save_tiny_eagle3, save_tiny_llama

torch.set_num_threads(1)
CONTEXT, ROOT = [4, 8, 15, 16, 23, 42], 50


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("drafters")


@pytest.fixture(scope="module")
def target_dir(tmp):
    return save_tiny_llama(tmp / "target", seed=0, num_layers=6)


@pytest.fixture(scope="module")
def target(target_dir):
    return load_target(target_dir)


def target_rows(target, ids, layers=()):
    out = target.model(input_ids=torch.tensor(ids)[None], output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i][0] for i in layers], -1) if layers else None
    return out, hidden


def test_spec_errors(target, tmp):
    for spec in ["foo:bar", "standalone", "early-exit:x", "eagle3:"]:
        with pytest.raises(ModelLoadError, match="drafter spec"):
            load_drafter(spec, target)
    with pytest.raises(FileNotFoundError):
        load_drafter(f"standalone:{tmp / 'missing'}", target)
    with pytest.raises(ModelLoadError, match="layers must be in"):
        load_drafter("early-exit:7", target)


def test_tokenizer_mismatch_is_refused(target, tmp):
    other = save_tiny_llama(tmp / "other_tok", seed=3, num_layers=1, tokenizer_vocab=100)
    with pytest.raises(TokenizerMismatchError) as err:
        load_drafter(f"standalone:{other}", target)
    assert "tokenizer differs" in str(err.value) and "\n" not in str(err.value)
    big = save_tiny_llama(tmp / "big_vocab", seed=3, num_layers=1, vocab_size=150)
    with pytest.raises(TokenizerMismatchError):
        load_drafter(f"standalone:{big}", target)


def test_early_exit_full_depth_is_the_target(target):
    drafter = load_drafter("early-exit:6", target)
    drafter.start(torch.tensor(CONTEXT))
    pool = drafter.grow_pool(ROOT, PoolShape(4, 3, 2))
    out, _ = target_rows(target, CONTEXT + [ROOT])
    np.testing.assert_allclose(pool.q_root, out.logits[0, -1].softmax(-1).numpy(), atol=1e-6)


def test_early_exit_shares_weights_and_matches_truncation(target):
    drafter = load_drafter("early-exit:2", target)
    assert drafter.model.model.layers[1] is target.model.model.layers[1]
    assert drafter.model.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    assert len(drafter.model.model.layers) == 2 and drafter.source_hash == target.source_hash
    drafter.start(torch.tensor(CONTEXT))
    pool = drafter.grow_pool(ROOT)
    out, h2 = target_rows(target, CONTEXT + [ROOT], (2,))
    ref = target.model.lm_head(target.model.model.norm(h2[-1])).softmax(-1)
    np.testing.assert_allclose(pool.q_root, ref.numpy(), atol=1e-6)
    assert len(pool) == 710 and pool.expanded.sum() == 70
    node = int(np.flatnonzero(pool.expanded & (pool.depth == 3))[0])
    path = [int(pool.token[pool.parent[pool.parent[node]]]), int(pool.token[pool.parent[node]]), int(pool.token[node])]
    _, h = target_rows(target, CONTEXT + [ROOT] + path, (2,))
    ref = torch.log_softmax(target.model.lm_head(target.model.model.norm(h[-1])), -1).topk(10)
    kids = np.flatnonzero(pool.parent == node)
    assert pool.token[kids].tolist() == ref.indices.tolist()
    np.testing.assert_allclose(np.log(pool.q_edge[kids]), ref.values.numpy(), atol=2e-5)


def windows(n=12, width=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 128, (width,), generator=gen).tolist() for _ in range(n)]


def test_exit_head_is_the_ridge_solution_and_helps(target, tmp):
    x, y = exit_regression_data(target, 2, windows())
    assert x.shape == (12 * 23, 32)  # first position of each window dropped
    head = solve_exit_head(target, x, y, ridge=0.0)
    xa = np.hstack([x.numpy(), np.ones((len(x), 1))])
    coef, *_ = np.linalg.lstsq(xa, y.numpy(), rcond=None)
    np.testing.assert_allclose(head.weight.numpy().T, coef[:-1], atol=1e-4)
    np.testing.assert_allclose(head.bias.numpy(), coef[-1], atol=1e-4)
    fitted = ((head(x.float()).double() - y) ** 2).mean()
    assert fitted < ((x - y) ** 2).mean()  # the identity head is a feasible, worse solution
    path = save_exit_head(tmp / "head.safetensors", fit_exit_head(target, 2, windows()), 2, target)
    drafter = load_drafter(f"early-exit:2:{path}", target)
    drafter.start(torch.tensor(CONTEXT))
    pool = drafter.grow_pool(ROOT, PoolShape(3, 2, 1))
    _, h2 = target_rows(target, CONTEXT + [ROOT], (2,))
    loaded = drafter.model.model.norm[0]
    ref = target.model.lm_head(target.model.model.norm(loaded(h2[-1]))).softmax(-1)
    np.testing.assert_allclose(pool.q_root, ref.numpy(), atol=1e-6)
    assert drafter.source_hash.startswith(target.source_hash + "+")
    with pytest.raises(ExitHeadError, match="fitted at 2 layers"):
        load_drafter(f"early-exit:3:{path}", target)


def test_fit_exit_head_command(target_dir, tmp, capsys):
    text = tmp / "text.txt"
    words = np.random.default_rng(0).choice(WORDS[:100], size=600)
    text.write_text(" ".join(words))
    out = tmp / "cli_head.safetensors"
    args = ["drafter", "fit-exit-head", "--target", str(target_dir), "--layers", "3", "--text", str(text)]
    assert main(args + ["--out", str(out), "--window", "32"]) == 0
    assert set(load_file(str(out))) == {"weight", "bias"} and "agreement" in capsys.readouterr().out
    assert main(args[:-1] + [str(tmp / "nope.txt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "text file not found" in err and "\n" not in err


@pytest.fixture(scope="module")
def eagle_dir(target, tmp):
    return save_tiny_eagle3(tmp / "eagle3", target.model.config, draft_vocab_size=48, seed=0)


def eagle_reference(drafter, target_hidden, ids, path):
    """Draft rows along ``path`` by uncached full forwards, feeding each node its parent's output."""
    head = drafter.head
    fused = head.fc(target_hidden)  # (L, H): pairs (h_t, x_{t+1}); the last pairs with the root
    tokens, hidden, rows = list(ids[1:]) + [ROOT], fused, []
    for node in [None] + path:
        if node is not None:
            tokens.append(node)
            hidden = torch.cat([hidden, out[-1:]])
        n = len(tokens)
        logits, out = head(torch.tensor(tokens), hidden, torch.arange(n), causal_mask(n, 0), None, fused=False)
        rows.append(torch.log_softmax(logits[-1], -1))
    return rows


def test_eagle3_round_trip_and_vocab_map(target, eagle_dir):
    drafter = load_drafter(f"eagle3:{eagle_dir}", target)
    state = load_file(str(eagle_dir / "model.safetensors"))
    assert json.loads((eagle_dir / "config.json").read_text())["draft_vocab_size"] == 48
    assert drafter.hidden_layers == (2, 3, 3)
    torch.testing.assert_close(drafter.head.fc.weight, state["fc.weight"])
    torch.testing.assert_close(drafter.head.midlayer.self_attn.q_proj.weight, state["midlayer.self_attn.q_proj.weight"])
    assert drafter.head.midlayer.self_attn.q_proj.in_features == 2 * 32
    assert drafter.head.embed_tokens is target.model.get_input_embeddings()
    assert drafter.draft_to_target.tolist() == state["t2d"].nonzero().flatten().tolist()


def test_eagle3_pool_exact_vs_sequential(target, eagle_dir):
    drafter = load_drafter(f"eagle3:{eagle_dir}", target)
    _, hidden = target_rows(target, CONTEXT, drafter.hidden_layers)
    drafter.start(torch.tensor(CONTEXT), hidden)
    pool = drafter.grow_pool(ROOT)
    assert len(pool) == 710 and pool.expanded.sum() == 70
    allowed = set(drafter.draft_to_target.tolist())
    assert set(pool.token.tolist()) <= allowed
    assert pool.q_root[sorted(set(range(128)) - allowed)].max() == 0
    node = int(np.flatnonzero(pool.expanded & (pool.depth == 3))[0])
    path = [int(pool.token[pool.parent[pool.parent[node]]]), int(pool.token[pool.parent[node]]), int(pool.token[node])]
    rows = eagle_reference(drafter, hidden, CONTEXT, path)
    np.testing.assert_allclose(pool.q_root[drafter.draft_to_target.numpy()], rows[0].exp().numpy(), atol=1e-6)
    ref = rows[-1].topk(10)
    kids = np.flatnonzero(pool.parent == node)
    assert pool.token[kids].tolist() == drafter.draft_to_target[ref.indices].tolist()
    np.testing.assert_allclose(np.log(pool.q_edge[kids]), ref.values.numpy(), atol=2e-5)


def test_eagle3_commit_then_grow_equals_fresh_start(target, eagle_dir):
    drafter = load_drafter(f"eagle3:{eagle_dir}", target)
    layers, shape = drafter.hidden_layers, PoolShape(4, 4, 3)
    _, hidden = target_rows(target, CONTEXT, layers)
    drafter.start(torch.tensor(CONTEXT), hidden)
    first = drafter.grow_pool(ROOT, shape)
    committed = [ROOT, int(first.token[0])]
    _, full = target_rows(target, CONTEXT + committed, layers)
    drafter.commit(committed, full[len(CONTEXT) :])
    after = drafter.grow_pool(60, shape)
    fresh = load_drafter(f"eagle3:{eagle_dir}", target)
    fresh.start(torch.tensor(CONTEXT + committed), full)
    again = fresh.grow_pool(60, shape)
    assert after.token.tolist() == again.token.tolist()
    np.testing.assert_allclose(after.draft_logp, again.draft_logp, atol=2e-5)
    with pytest.raises(ValueError, match="hidden states of shape"):
        drafter.commit([1, 2], full[:1])


def test_eagle3_checkpoint_variants_and_errors(target, tmp, eagle_dir):
    own = save_tiny_eagle3(tmp / "eagle3_emb", target.model.config, seed=1, with_embedding=True)
    drafter = load_drafter(f"eagle3:{own}", target)
    assert drafter.head.embed_tokens is not target.model.get_input_embeddings()
    bin_dir = tmp / "eagle3_bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text((eagle_dir / "config.json").read_text())
    torch.save(load_file(str(eagle_dir / "model.safetensors")), bin_dir / "pytorch_model.bin")
    from_bin = load_drafter(f"eagle3:{bin_dir}", target)
    saved = load_file(str(eagle_dir / "model.safetensors"))
    torch.testing.assert_close(from_bin.head.lm_head.weight, saved["lm_head.weight"])
    bad = tmp / "eagle3_bad"
    bad.mkdir()
    (bad / "config.json").write_text((eagle_dir / "config.json").read_text())
    state = load_file(str(eagle_dir / "model.safetensors"))
    state["t2d"] = torch.zeros_like(state["t2d"])
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="disagree"):
        load_drafter(f"eagle3:{bad}", target)
    cfg = json.loads((eagle_dir / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(cfg, vocab_size=200)))
    with pytest.raises(TokenizerMismatchError, match="vocabulary"):
        load_drafter(f"eagle3:{bad}", target)


def test_eagle3_default_is_the_cached_head_else_the_shipped_one(target, eagle_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    with pytest.raises(TokenizerMismatchError, match="vocabulary"):  # the shipped SmolLM2 head, not for this target
        load_drafter("eagle3:default", target)
    (tmp_path / "drafters").mkdir()
    (tmp_path / "drafters" / "smollm2-eagle3").symlink_to(eagle_dir)
    drafter = load_drafter("eagle3:default", target)
    assert drafter.path == tmp_path / "drafters" / "smollm2-eagle3" and drafter.spec == "eagle3:default"
