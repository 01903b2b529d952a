"""GPU-shaped decoding benchmark: draft and reranked selection with a Llama-3.1-8B-shaped target and an
EAGLE-3-shaped head, per-round milliseconds split into drafting, tree pass, reranker and host bookkeeping.

Weights are random (timing does not depend on them): the target is built from Llama-3.1-8B's config
(32 layers, hidden 4096, 8 KV heads, vocabulary 128,256) in bf16, the head from the shape EAGLE-3
publishes for it (one layer, draft vocabulary 32,000, features from 3 target layers). A random head
agrees with a random target about never, so every round emits one token: ``--rounds`` rounds run.
The reranker is a Rows LightGBM reranker of the paper's size (400 trees, 63 leaves) fitted on
synthetic rounds. Each decoder runs twice: once as users run it (its total per round), once with the
device synchronised at every span boundary (the split). ``reranker_share_of_round`` is the reranked
decoder's reranker milliseconds over its round's (split run), also printed per budget on stderr.

    python benchmarks/bench_gpu.py --shape tiny                     # CPU smoke test (a test runs it)
    python benchmarks/bench_gpu.py --device cuda --shape llama-3.1-8b --rounds 100   # B = 59 and 8

On a lent GPU machine (its python3 holds torch, transformers, pandas, pyarrow and scikit-learn, not
LightGBM): here, once, `echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps
--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl
lightgbm==4.7.0`; then one run, carrying `.whl` (about 3 minutes, most of it building the model):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:src python3 benchmarks/bench_gpu.py --device cuda --shape llama-3.1-8b --rounds 100

Goal (issue 15): host bookkeeping at most 5 ms and reranker features plus inference at most 2 ms per
round. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

SHAPES = {
    # Llama-3.1-8B's config.json (meta-llama/Llama-3.1-8B), the fields that set compute and memory.
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                         rope_theta=500000.0, rms_norm_eps=1e-5,
                         rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, rope_theta=10000.0,
                 rms_norm_eps=1e-5),
}
DRAFT_VOCAB = {"llama-3.1-8b": 32000, "tiny": 128}


def random_init_(module, std: float = 0.02) -> None:
    """Random weights in place: normal matrices, unit norms (no checkpoint needed to time a model)."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
            else:
                p.fill_(1.0)


def build_target(shape: str, device, dtype):
    """A random Llama target of ``shape`` wrapped as a specrank Target (no tokenizer, no EOS)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specrank.decode.loading.targets import Target

    config = LlamaConfig(**SHAPES[shape], tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    random_init_(model)
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # buffers are computed, not stored
    model.generation_config.eos_token_id = None
    return Target(model.eval().requires_grad_(False), None, name=f"random-{shape}")


def build_head(target, shape: str, device, dtype):
    """A random EAGLE-3 head for ``target`` (draft vocabulary of the published heads' size)."""
    import torch

    from specrank.decode.loading.eagle3 import Eagle3Drafter, Eagle3Head, eagle3_config

    cfg = {k: v for k, v in SHAPES[shape].items() if k != "num_hidden_layers"}
    cfg.update(num_hidden_layers=1, draft_vocab_size=DRAFT_VOCAB[shape], tie_word_embeddings=False)
    config = eagle3_config(cfg)
    with torch.device("meta"):
        head = Eagle3Head(config)
    head = head.to_empty(device=device).to(dtype)
    random_init_(head)
    head.rotary_emb = type(head.rotary_emb)(config).to(device)
    head.embed_tokens = target.model.get_input_embeddings()  # shared, as the published heads do
    gen = torch.Generator().manual_seed(0)
    d2t = torch.randperm(target.vocab_size, generator=gen)[: config.draft_vocab_size].sort().values
    layers = (2, target.num_layers // 2, target.num_layers - 3)
    return Eagle3Drafter(head.eval().requires_grad_(False), target.vocab_size, d2t, layers, spec=f"random-eagle3-{shape}")


def fit_reranker(topk: int):
    """A Rows reranker of the paper's size (400 trees, 63 leaves) fitted on synthetic greedy rounds."""
    from specrank.featurize import featurize_rounds
    from specrank.featurize.synthetic import synthetic_rounds
    from specrank.rerankers import GBMReranker

    table, _ = synthetic_rounds(40, 20, topk=topk, depth=8, expand=topk, temperature=0.0)
    features = featurize_rounds(table, {"temperature": 0.0, "topk": topk})
    return GBMReranker(features="rows", n_estimators=400, num_leaves=63, n_jobs=1).fit(features)


def per_round(timer, rounds: int) -> dict:
    split = timer.split()
    return {k: 1000 * split[k] / rounds for k in ("prefill", "draft", "target", "rerank", "bookkeeping", "total")}


def run_decoder(decoder, prompt, rounds: int, sync) -> dict:
    """Per-round milliseconds of one decode of ``rounds`` tokens, unsynchronised and synchronised."""
    from specrank.decode.decoder import AcceptedCounter
    from specrank.decode.engine.prompt import decode_prompt
    from specrank.decode.engine.timer import Timer

    out = {}
    for label, timer in (("as_run", Timer()), ("split", Timer(sync=sync))):
        counter = AcceptedCounter()
        config = decoder._config(rounds, 0.0, 0)
        decode_prompt(decoder.target, decoder.drafter, prompt, config, decoder.strategy, observer=counter, timer=timer)
        out[label] = per_round(timer, timer.rounds) | {"rounds": timer.rounds,
                                                        "tokens_per_round": timer.tokens / timer.rounds}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", default=None, help="bfloat16 (default on cuda) or float32 (default on cpu)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--budget", type=int, action="append", default=None, help="B (repeat for several)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-bookkeeping-ms", type=float, default=5.0)
    parser.add_argument("--max-rerank-ms", type=float, default=2.0)
    args = parser.parse_args(argv)

    import torch

    from specrank.decode import Decoder
    from specrank.decode.loading.targets import parse_device, parse_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    device = parse_device(args.device)
    dtype = parse_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    start = time.perf_counter()
    torch.manual_seed(0)
    target = build_target(args.shape, device, dtype)
    drafter = build_head(target, args.shape, device, dtype)
    reranker = fit_reranker(10)
    built = time.perf_counter() - start
    prompt = torch.randint(0, target.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "shape": args.shape, "dtype": str(dtype).removeprefix("torch."), "prompt_len": args.prompt_len,
              "rounds": args.rounds, "build_seconds": built, "budgets": {},
              "reranker_share_of_round": {}}
    for budget in args.budget or [59, 8]:
        decoders = {"draft": Decoder(target, drafter, "draft", budget=budget),
                    "reranked": Decoder(target, drafter, "reranked", reranker=reranker, budget=budget)}
        for d in decoders.values():  # warm-up: kernels, allocator, LightGBM
            run_decoder(d, prompt[:64], 3, sync)
        result["budgets"][budget] = {name: run_decoder(d, prompt, args.rounds, sync) for name, d in decoders.items()}
        split = result["budgets"][budget]["reranked"]["split"]
        result["reranker_share_of_round"][budget] = split["rerank"] / split["total"]
        print(f"B = {budget}: reranker {split['rerank']:.3f} ms of a {split['total']:.2f} ms round "
              f"({100 * split['rerank'] / split['total']:.2f}%)", file=sys.stderr)
    result["goals"] = {"bookkeeping_ms_per_round": args.max_bookkeeping_ms, "rerank_ms_per_round": args.max_rerank_ms}
    worst = max(r["split"]["bookkeeping"] for b in result["budgets"].values() for r in b.values())
    rerank = max(b["reranked"]["split"]["rerank"] for b in result["budgets"].values())
    result["met"] = {"bookkeeping": worst <= args.max_bookkeeping_ms, "rerank": rerank <= args.max_rerank_ms}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
