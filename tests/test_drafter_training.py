"""EAGLE-3 head training: self-distillation data, the training-time test, determinism, resume, CLI."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
import torch

from specrank.decode.loading.eagle3 import load_eagle3
from specrank.decode.loading.target_passes import Target
from specrank.decode.core import PoolShape
from specrank.decode.prompts import Prompt, encode_prompt
from specrank.drafter_training.batches import collate, windows
from specrank.drafter_training.data import Corpus, DataError, GenerationSpec, generate_corpus, jobs, load_corpus
from specrank.drafter_training.diagnostics import agreement_by_confidence, first_token_rows
from specrank.drafter_training.head import new_head, save_head
from specrank.drafter_training.objective import target_logits
from specrank.drafter_training.train import TrainConfig, TrainError, batch_loss, evaluate, train
from specrank.drafter_training.unroll import ttt_mask, unrolled_logits
from specrank.drafter_training.vocab import most_frequent
from specrank.testing import save_tiny_llama, tiny_llama, tiny_tokenizer

LAYERS = (1, 2, 3)
SPEC = GenerationSpec(layers=LAYERS, samples=2, max_new_tokens=10, batch_size=4, seed=3)
PROMPTS = [Prompt(f"p{i}", "t" if i < 4 else "u", "the cat is " + "big " * i) for i in range(6)]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return Target(tiny_llama(seed=1), tiny_tokenizer())


@pytest.fixture(scope="module")
def data(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    return generate_corpus(target, PROMPTS, SPEC, root=root), root


@pytest.fixture(scope="module")
def corpus(data):
    return load_corpus(data[0])


def setup(target, corpus, vocab_size=40, seed=0):
    vocab = most_frequent(corpus.argmax, target.vocab_size, vocab_size)
    head = new_head(target, vocab, seed)
    teacher = functools.partial(target_logits, lm_head=target.model.get_output_embeddings(), ids=vocab.ids)
    return head, teacher, vocab


def run(target, corpus, out, cfg, seed=0, logger=None):
    head, teacher, vocab = setup(target, corpus, seed=seed)
    slices = corpus.sequences(lambda pid: pid != "p5")
    result = train(head, teacher, vocab.ids, corpus, slices, corpus.sequences(lambda p: p == "p5"), out, cfg, logger)
    return head, vocab, result


def trained_state(head):
    return {k: v.clone() for k, v in head.state_dict().items() if not k.startswith(("embed_tokens", "rotary"))}


CFG = TrainConfig(steps=6, batch_size=2, max_len=12, lr=3e-3, warmup=2, eval_every=3, checkpoint_every=3, seed=5)


def test_draft_vocab_keeps_most_frequent_and_maps_every_draft_id():
    tokens = torch.tensor([7, 7, 7, 2, 2, 9, 9, 4, 11])  # counts: 7:3, 2:2, 9:2, then 4 and 11 once
    vocab = most_frequent(tokens, 16, 4)
    assert vocab.ids.tolist() == [2, 4, 7, 9]  # ties broken by the lower id (4 before 11), id order
    assert (torch.arange(4) + vocab.d2t).tolist() == vocab.ids.tolist()
    assert vocab.t2d.nonzero().flatten().tolist() == [2, 4, 7, 9]
    assert most_frequent(tokens, 16, 100).ids.tolist() == [2, 4, 7, 9, 11]  # capped at distinct ids
    assert vocab.coverage(torch.tensor([2, 3])) == 0.5
    with pytest.raises(ValueError, match="positive"):
        most_frequent(tokens, 16, 0)


def test_generation_stores_greedy_continuations_and_exact_target_rows(target, corpus):
    assert len(corpus.docs) == len(PROMPTS) * (1 + SPEC.samples)
    assert corpus.features.shape == (len(corpus.input_ids), 3 * target.hidden_size)
    # The stored final states reproduce the target's full-vocabulary argmax through its lm head.
    logits = target.model.get_output_embeddings()(corpus.last.float())
    assert (logits.argmax(-1) == corpus.argmax).float().mean() == 1.0
    bounds = corpus.offsets.tolist()
    greedy = [i for i, (_, s) in enumerate(corpus.docs) if s == 0]
    sampled_differs = False
    for i, (pid, sample) in enumerate(corpus.docs):
        ids = corpus.input_ids[bounds[i] : bounds[i + 1]]
        n_prompt = len(encode_prompt(target.tokenizer, PROMPTS[int(pid[1:])].text))
        assert corpus.response[bounds[i] : bounds[i + 1]].tolist() == [t >= n_prompt - 1 for t in range(len(ids))]
        follows = ids[n_prompt:] == corpus.argmax[bounds[i] + n_prompt - 1 : bounds[i + 1] - 1]
        if i in greedy:
            assert follows.all(), f"greedy continuation of {pid} leaves the target argmax"
        sampled_differs |= not bool(follows.all())
    assert sampled_differs  # sampling at temperature 1 is not greedy


def test_generation_resumes_a_missing_shard_identically(target, data):
    directory, root = data
    from safetensors.torch import load_file

    shard = directory / "shard-00002.safetensors"  # a sampled shard: the seed matters
    before = load_file(str(shard))
    shard.unlink()
    assert generate_corpus(target, PROMPTS, SPEC, root=root) == directory
    after = load_file(str(shard))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert len(jobs(PROMPTS, SPEC)) == len(list(directory.glob("shard-*.safetensors")))


def test_generation_refuses_bad_settings(target, tmp_path):
    with pytest.raises(DataError, match="layers"):
        generate_corpus(target, PROMPTS, GenerationSpec(layers=(1, 2, 99)), root=tmp_path)
    with pytest.raises(DataError, match="temperature"):
        GenerationSpec(layers=LAYERS, temperature=0.0)
    with pytest.raises(DataError, match="no prompts"):
        generate_corpus(target, [], SPEC, root=tmp_path)


def test_batches_pair_each_state_with_the_next_token_and_later_rows():
    n, h = 7, 2
    corpus = Corpus(
        input_ids=torch.arange(100, 100 + n),
        features=torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 3 * h),
        last=torch.arange(n, dtype=torch.float32)[:, None].repeat(1, h) + 0.5,
        argmax=torch.arange(200, 200 + n),
        offsets=torch.tensor([0, 4, n]),
        response=torch.tensor([False, False, True, True, False, True, True]),
        docs=[("a", 0), ("b", 0)],
    )
    batch = collate(corpus, windows(corpus.sequences(lambda p: True), max_len=10), steps=2)
    assert batch.features[0, :3, 0].tolist() == [0, 1, 2]  # h_i at index i
    assert batch.tokens[0, :3].tolist() == [101, 102, 103]  # x_{i+1} at index i
    assert batch.last[1, :2, 0].tolist() == [5.5, 6.5] and batch.argmax[1, :2].tolist() == [205, 206]
    assert batch.valid(0).tolist() == [[True, True, True], [True, True, False]]
    assert batch.valid(1).tolist() == [[True, True, False], [True, False, False]]
    assert batch.valid(0, response_only=True).tolist() == [[False, True, True], [True, True, False]]
    assert [(w.start, w.stop) for w in windows([slice(0, 8)], max_len=3)] == [(0, 4), (3, 7), (6, 8)]


def test_ttt_mask_sees_the_context_and_the_own_ancestors():
    allowed = ttt_mask(3, 2) == 0  # (3, 9): step-0 causal block, then the diagonals of steps 1 and 2
    assert allowed[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert allowed[:, 3:6].tolist() == allowed[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_unrolled_steps_equal_drafting_with_the_adapter(target, corpus, tmp_path):
    """Unrolled step j at index i = the drafter's depth-j node below root x[i+1] (control: step 0 differs)."""
    head, _, vocab = setup(target, corpus)
    save_head(tmp_path, head, vocab, LAYERS)
    drafter = load_eagle3(tmp_path, target)
    seq = corpus.sequences(lambda pid: pid == "p3")[0]
    batch = collate(corpus, [seq], steps=3)
    with torch.no_grad():
        steps = [torch.log_softmax(s[0], -1) for s in unrolled_logits(head, batch, 3)]
    ids, feats = corpus.input_ids[seq], corpus.features[seq].float()
    for i in (0, 4, 9):
        drafter.start(ids[: i + 1], feats[: i + 1])
        root = drafter._draft_root(int(ids[i + 1]))
        torch.testing.assert_close(root.logp, steps[0][i], atol=1e-4, rtol=0)
        feed = root.feed[None]
        for j in (1, 2):  # the path x[i+2], x[i+3] below the root
            mask = torch.zeros(1, root.visible + j)
            logp, feed = drafter._draft_step(ids[i + 1 + j : i + 2 + j], torch.tensor([root.position + j]), mask, feed)
            torch.testing.assert_close(logp[0], steps[j][i], atol=1e-4, rtol=0)
            assert not torch.allclose(logp[0], steps[0][i + j], atol=1e-3)
        drafter._rewind()


def test_trained_head_saves_reloads_and_drafts_pools(target, corpus, tmp_path):
    head, vocab, result = run(target, corpus, tmp_path, CFG)
    assert result["step"] == CFG.steps and "heldout_top1_step1" in result
    save_head(tmp_path, head, vocab, LAYERS)
    drafter = load_eagle3(tmp_path, target)
    assert drafter.hidden_layers == LAYERS
    assert torch.equal(drafter.draft_to_target.cpu(), vocab.ids)  # d2t sends every draft id to its target id
    ids = corpus.input_ids[: corpus.offsets[1]]
    drafter.start(ids[:-1], corpus.features[: len(ids) - 1].float())
    shape = PoolShape(topk=4, depth=3, expand=2)
    pool = drafter.grow_pool(int(ids[-1]), shape)
    assert pool.token.shape == pool.parent.shape == (shape.size,)
    assert np.isin(pool.token, vocab.ids.numpy()).all() and pool.q_root.shape == (target.vocab_size,)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["draft_vocab_size"] == len(vocab.ids)


def test_training_is_deterministic_and_resume_gives_the_same_weights(target, corpus, tmp_path):
    a, _, res_a = run(target, corpus, tmp_path / "a", CFG)
    b, _, _ = run(target, corpus, tmp_path / "b", CFG)
    other, _, _ = run(target, corpus, tmp_path / "c", TrainConfig(**{**CFG.identity(), "seed": 6}), seed=6)
    sa, sb, so = trained_state(a), trained_state(b), trained_state(other)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], so[k]) for k in sa)  # negative control: the seed matters

    def interrupt(metrics, step):
        if step == 5:
            raise KeyboardInterrupt  # after step 5, whose checkpoint was never written

    with pytest.raises(KeyboardInterrupt):
        run(target, corpus, tmp_path / "r", CFG, logger=interrupt)
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["step"] == 3
    resumed, _, res_r = run(target, corpus, tmp_path / "r", CFG)
    sr = trained_state(resumed)
    assert all(torch.equal(sa[k], sr[k]) for k in sa)
    assert res_r["heldout_top1_step0"] == res_a["heldout_top1_step0"]
    _, _, again = run(target, corpus, tmp_path / "r", CFG)  # finished: nothing trained, same metrics
    assert again["step"] == CFG.steps and again["heldout_top1_step0"] == res_a["heldout_top1_step0"]
    with pytest.raises(TrainError, match="lr"):
        run(target, corpus, tmp_path / "r", TrainConfig(**{**CFG.identity(), "lr": 1e-3}))


def test_training_lowers_the_loss(target, corpus, tmp_path):
    cfg = TrainConfig(steps=40, batch_size=4, max_len=16, lr=3e-3, warmup=2, eval_every=40, checkpoint_every=40)
    _, _, result = run(target, corpus, tmp_path, cfg)
    losses = [h["loss_step0"] for h in result["history"]]
    assert np.mean(losses[-8:]) < 0.8 * np.mean(losses[:8])
    head, teacher, vocab = setup(target, corpus)
    batch = collate(corpus, windows(corpus.sequences(lambda p: True), 16)[:4], 2)
    everywhere = batch_loss(head, teacher, batch, vocab.ids, cfg)[2]
    generated = batch_loss(head, teacher, batch, vocab.ids, TrainConfig(**{**cfg.identity(), "response_only": True}))[2]
    assert generated[0][1] == int(batch.valid(0, True).sum()) < everywhere[0][1] == int(batch.valid(0).sum())


def test_agreement_by_confidence_bins_the_target_rows_the_head_is_scored_on(target, corpus):
    head, _, vocab = setup(target, corpus, vocab_size=8)  # small: some target argmaxes have no draft id
    slices = corpus.sequences(lambda p: True)
    rows = first_token_rows(head, corpus, slices, vocab.ids, target.model.get_output_embeddings(), max_len=64)
    assert head.training  # left as it was
    cfg = TrainConfig(unroll=1, max_len=64)
    assert rows["agree"].float().mean().item() == pytest.approx(evaluate(head, corpus, windows(slices, 64), vocab.ids, cfg)[0])
    # Confidence is the target's own top-1 probability at the row, from a plain forward pass.
    expected = []
    for s in slices:
        with torch.no_grad():
            probs = torch.softmax(target.model(corpus.input_ids[s][None]).logits[0, 1:].float(), -1)  # rows 1..n-1
        expected.append(probs.amax(-1)[corpus.response[s.start + 1 : s.stop]])
    assert torch.allclose(rows["confidence"], torch.cat(expected), atol=1e-5)
    assert 0 < rows["in_vocab"].float().mean() < 1
    assert not rows["agree"][~rows["in_vocab"]].any()  # a token without a draft id is never proposed
    table = agreement_by_confidence(rows)
    bins, total = table[:-1], table[-1]
    assert sum(b["rows"] for b in bins) == total["rows"] == len(rows["agree"])
    assert sum(b["share"] for b in bins) == pytest.approx(1.0)
    assert total["agreement"] == pytest.approx(sum(b["share"] * b["agreement"] for b in bins if b["rows"]))
    assert total["agreement_in_vocab"] == pytest.approx(total["agreement"] / total["in_vocab"])
    sure = rows["confidence"] >= 0.9
    assert bins[-1]["rows"] == int(sure.sum()) and bins[0]["rows"] == int((rows["confidence"] < 0.3).sum())


def test_cli_trains_saves_and_logs_to_mlflow(tmp_path, monkeypatch):
    from specrank.cli import main

    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model_dir = save_tiny_llama(tmp_path / "target", seed=2)
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"question_id": p.prompt_id, "category": p.task, "turns": [p.text]} for p in PROMPTS]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["drafter", "train", "--target", str(model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "head"),
            "--layers", "1", "2", "3", "--samples", "1", "--max-new-tokens", "8", "--steps", "4", "--batch-size", "2",
            "--max-len", "12", "--eval-every", "2", "--draft-vocab", "30", "--decode-prompts", "1",
            "--tracking-uri", uri, "--no-progress", "--threads", "1"]
    assert main(args) == 0
    summary = json.loads((tmp_path / "head" / "training.json").read_text())
    assert summary["final"]["tokens_per_pass_b59"] >= 1.0 and summary["params"]["draft_vocab_size"] <= 30
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the run's store is not left set for the process
    import mlflow

    run_id = (tmp_path / "head" / "mlflow_run_id").read_text()
    history = mlflow.MlflowClient(tracking_uri=uri).get_metric_history(run_id, "heldout_top1_step1")
    assert [m.step for m in history][-1] == 4
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps({"question_id": f"x{i}", "turns": [f"the dog {i}"]}) + "\n" for i in range(3)))
    head2 = str(tmp_path / "head2")
    assert main(args + ["--out", head2, "--train-prompts", str(extra), "--train-limit", "2", "--train-max-new-tokens", "5"]) == 0
    params = json.loads((tmp_path / "head2" / "training.json").read_text())["params"]
    assert params["training_only_prompts"] == 2 and params["train_tokens"] > summary["params"]["train_tokens"]
    assert main(args + ["--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert main(args + ["--draft-vocab", "0"]) == 2
    assert main(args + ["--tracking-uri", f"sqlite:///{tmp_path / 'no' / 'such' / 'm.db'}"]) == 2


def test_training_only_prompts_add_data_but_never_a_heldout_prompt(target):
    from specrank.drafter_training.fit import training_only

    held = {"p1"}
    extra = [Prompt("x0", "t", "a new prompt"), Prompt("x1", "t", PROMPTS[1].text), Prompt("x2", "u", PROMPTS[2].text)]
    assert [p.prompt_id for p in training_only(extra, PROMPTS, held)] == ["x0", "x2"]  # x1 repeats held-out p1
    with pytest.raises(ValueError, match="reuse ids"):
        training_only([Prompt("p3", "t", "other text")], PROMPTS, held)


def test_corpora_of_two_directories_load_as_one(target, data, tmp_path):
    first = load_corpus(data[0])
    extra = [Prompt(f"x{i}", "t", "a dog is " + "small " * i) for i in range(3)]
    second_dir = generate_corpus(target, extra, GenerationSpec(layers=LAYERS, samples=0, max_new_tokens=6), root=tmp_path)
    second = load_corpus(second_dir)
    both = load_corpus(data[0], second_dir)
    n = len(first.input_ids)
    assert torch.equal(both.input_ids, torch.cat([first.input_ids, second.input_ids]))
    assert torch.equal(both.offsets, torch.cat([first.offsets, second.offsets[1:] + n]))
    assert both.docs == first.docs + second.docs and torch.equal(both.response[n:], second.response)
    assert len(both.sequences(lambda pid: pid.startswith("x"))) == 3
