"""GPU-shaped decoding benchmark: draft and reranked selection with a Llama-3.1-8B-shaped target and an
EAGLE-3-shaped head, per-round milliseconds split into drafting, tree pass, reranker and host bookkeeping.

Weights are random (timing does not depend on them): the target is built from Llama-3.1-8B's config
(32 layers, hidden 4096, 8 KV heads, vocabulary 128,256) in bf16, the head from the shape EAGLE-3
publishes for it (one layer, draft vocabulary 32,000, features from 3 target layers). A random head
agrees with a random target about never, so every round emits one token: ``--rounds`` rounds run.
The rerankers (Rows by default; ``--rerankers``) are fitted on synthetic rounds, the GBMs at their
default size unless ``--gbm-size`` names another. Each decoder runs twice: once as users run it (its
total per round), once with the device synchronised at every span boundary (the split).
``reranker_share_of_round`` is the reranked decoder's reranker milliseconds over its round's (split
run), also printed per budget on stderr.

    python benchmarks/bench_gpu.py --shape tiny                     # CPU smoke test (a test runs it)
    python benchmarks/bench_gpu.py --device cuda --shape llama-3.1-8b --rounds 100   # B = 59 and 8
    python benchmarks/bench_gpu.py --shape llama-3.1-8b --layers 2 --device cpu --prompt-len 710 \
        --record-rounds 2 --rounds 2 --strategies reranked --warmup-rounds 1      # 8B width on CPU (~8 GB fp32)

``--layers N`` keeps N of the target's layers (its width, heads and 128,256-token vocabulary unchanged), the
head then reading ``hidden_states`` (0, 1, N) when N < 5 (N = the last layer's output before the final norm).
``--record-rounds R`` also records R rounds as the recorder does (every one of the pool's M = 710 edges
scored by the target). ``--profile-rounds R`` profiles R more rounds of each budget's first decoder and
reports the PyTorch operations of its host bookkeeping (outside every timed span), by count and host time: on
CUDA, an operation that waits for the device shows there. Peak memory is the device's peak allocation (CUDA)
or the process's peak resident set (CPU, Linux ``VmHWM``), reset before each phase: after building, recording,
and each budget's decodes.

``--graphs both`` (the default on CUDA) times every budget's decoders with CUDA graphs and without
(``budgets`` and ``budgets_no_graphs``) and reports ``graphs_speedup``, a round's milliseconds without over with;
``--profile-rounds`` also sets each timed span's wall time against the device's busy time inside it (the
union of its kernels, copies and fills; wall time only on a CPU).

On a lent GPU machine, `benchmarks/gpu_check.sh` runs it with the wheels the machine's image lacks
(docs/benchmarks.md, "The GPU check").

Goal: host bookkeeping at most 5 ms and reranker features plus inference at most 0.15 ms per round (1% of
a 14.5 ms EAGLE-3 round of an 8B target on one H100). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from harness import gbm_size, write_results  # benchmarks/harness.py, beside this script

from specrank.decode.runs.timeline import span_table

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
    # Llama-3.1-8B's vocabulary at a tiny width: token ids above 65,535 through every path (a test runs it)
    "tiny-128k-vocab": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128256, max_position_embeddings=4096,
                            rope_theta=10000.0, rms_norm_eps=1e-5),
}
DRAFT_VOCAB = {"llama-3.1-8b": 32000, "tiny": 128, "tiny-128k-vocab": 32000}


def random_init_(module, std: float = 0.02) -> None:
    """Random weights in place: normal matrices, unit norms (no checkpoint needed to time a model)."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
            else:
                p.fill_(1.0)


def build_target(shape: str, device, dtype, layers: int | None = None):
    """A random Llama target of ``shape`` (``layers`` of its layers, default all) wrapped as a specrank Target
    (no tokenizer, no EOS)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specrank.decode.loading.target_passes import Target

    fields = {**SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})}
    config = LlamaConfig(**fields, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
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

    from specrank.decode.loading.eagle3 import Eagle3Drafter
    from specrank.decode.loading.eagle3_head import Eagle3Head, eagle3_config

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
    n = target.num_layers
    layers = (2, n // 2, n - 3) if n >= 5 else (0, 1, n)  # a cut-down target: embeddings up to the last layer
    return Eagle3Drafter(head.eval().requires_grad_(False), target.vocab_size, d2t, layers, spec=f"random-eagle3-{shape}")


RERANKERS = ("rows", "base", "isotonic", "per-depth")


def fit_rerankers(topk: int, names, gbm: dict | None = None) -> dict:
    """{name: reranker} fitted on synthetic greedy rounds: the GBMs (Rows, Base) at their default size or with
    ``gbm``'s parameters, isotonic on the first factor, per-depth calibration on every edge."""
    from specrank.featurize import featurize_rounds
    from specrank.featurize.edges import edge_frame
    from specrank.featurize.synthetic import synthetic_rounds
    from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration

    manifest = {"temperature": 0.0, "topk": topk}
    table, _ = synthetic_rounds(40, 20, topk=topk, depth=8, expand=topk, temperature=0.0)
    features = featurize_rounds(table, manifest)
    gbm = gbm or {}
    fit = {"rows": lambda: GBMReranker(features="rows", n_jobs=1, **gbm).fit(features),
           "base": lambda: GBMReranker(features="base", n_jobs=1, **gbm).fit(features),
           "isotonic": lambda: IsotonicFirstFactor().fit(features),
           "per-depth": lambda: PerDepthCalibration().fit(edge_frame(table, manifest))}
    return {name: fit[name]() for name in names}


def reset_peak(device) -> None:
    """Start a new peak: the device's allocation statistics on CUDA, else the process's peak resident set
    (Linux: writing 5 to ``/proc/self/clear_refs`` resets ``VmHWM``)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the peak stays the process's since it started
        pass


def peak_memory_mib(device) -> float:
    """The peak since ``reset_peak``: the device's allocation on CUDA, else the resident set (``VmHWM``)."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def record_rounds(target, drafter, prompt, rounds: int, budget: int, sync) -> dict:
    """Record ``rounds`` rounds as the recorder does (every pool edge scored): per-round split, the pool size
    and the largest token id the records hold (ids above 65,535 must survive)."""
    from specrank.decode.config import DecodeConfig
    from specrank.decode.engine.timer import Timer
    from specrank.decode.runs.recorder import record_prompt

    timer = Timer(sync=sync)
    _, records = record_prompt(target, drafter, prompt, DecodeConfig(budget=budget, max_new_tokens=rounds), timer=timer)
    return per_round(timer, timer.rounds) | {"rounds": timer.rounds, "pool_size": int(len(records[0]["token"])),
                                              "scored_per_round": sum(r["n_scored"] for r in records) / len(records),
                                              "max_token": int(max(r["token"].max() for r in records)),
                                              "p_edge_finite": float(sum(float((r["p_edge"] == r["p_edge"]).mean())
                                                                         for r in records) / len(records))}


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


GRAPHS = {"on": (True,), "off": (False,), "both": (True, False)}


def use_graphs(target, drafter, on: bool) -> None:
    """CUDA graphs on or off for the target's and the drafter's passes (attributes the engine reads when it runs;
    an engine without graphs ignores them)."""
    setattr(target, "graphs", on)
    setattr(drafter, "graphs", on)


def make_decoders(target, drafter, names, rerankers: dict, budget: int) -> dict:
    """{name: Decoder} at ``budget``: draft selection (when named) and each reranker's reranked selection."""
    from specrank.decode import Decoder

    decoders = {"draft": Decoder(target, drafter, "draft", budget=budget)} if "draft" in names else {}
    return decoders | {reranked_name(k): Decoder(target, drafter, "reranked", reranker=r, budget=budget)
                       for k, r in rerankers.items()}


def time_decoders(decoders: dict, prompt, rounds: int, warmup: int, sync) -> dict:
    """{name: ``run_decoder``'s figures} after warming every decoder up at the timed shapes."""
    for d in decoders.values():  # kernels, matmul algorithms, allocators (and graph captures)
        if warmup:
            run_decoder(d, prompt, warmup, sync)
    if warmup:  # one decode as long as the timed ones, so the KV cache has reached the timed lengths once: in the
        # first GPU runs the first decoder timed at each budget ran two to four times slower unsynchronised than
        # synchronised after a few warm-up rounds (the cause not yet confirmed)
        run_decoder(next(iter(decoders.values())), prompt, rounds, sync)
    return {name: run_decoder(d, prompt, rounds, sync) for name, d in decoders.items()}


def graphs_speedup(on: dict, off: dict, names) -> dict:
    """{decoder: its round's milliseconds without graphs over with them}, as users run it (unsynchronised)."""
    return {name: off[name]["as_run"]["total"] / on[name]["as_run"]["total"] for name in names}


def reranked_name(kind: str) -> str:
    return "reranked" if kind == "rows" else f"reranked-{kind}"


def bookkeeping_profile(decoder, prompt, rounds: int, sync, top: int = 25) -> dict:
    """The PyTorch operations a decode issues outside its timed spans (host bookkeeping), per round: each
    top-level ATen operation's count and host microseconds, the most expensive first, with the device's kernels
    on CUDA. Spans are labelled for the profiler only here (``record_function`` costs the loop a little)."""
    from contextlib import contextmanager

    from torch.profiler import ProfilerActivity, profile, record_function

    from specrank.decode.engine.timer import Timer

    plain = Timer.span

    @contextmanager
    def labelled(self, name):
        with record_function(f"span:{name}"), plain(self, name):
            yield

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if sync is not None else [])
    Timer.span = labelled
    try:
        with profile(activities=activities) as prof:
            run_decoder(decoder, prompt, rounds, sync)
    finally:
        Timer.span = plain
    events = prof.events()
    table = span_table(events, 2 * rounds, sync is not None)
    spans = [(e.time_range.start, e.time_range.end) for e in events
             if e.name.startswith("span:") and e.name != "span:total"]
    parent = lambda e: e.cpu_parent.name if e.cpu_parent is not None else ""  # noqa: E731
    outside = [e for e in events if e.name.startswith("aten::") and not parent(e).startswith("aten::")
               and not any(a <= e.time_range.start and e.time_range.end <= b for a, b in spans)]
    n = 2 * rounds  # run_decoder decodes twice: as run and split
    ops = {}
    for e in outside:
        count, us = ops.get(e.name, (0, 0.0))
        ops[e.name] = (count + 1, us + e.cpu_time_total)
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
    return {"rounds": n, "ops_per_round": len(outside) / n,
            "host_us_per_round": sum(e.cpu_time_total for e in outside) / n,
            "ops": {name: {"per_round": c / n, "host_us_per_round": us / n} for name, (c, us) in ranked},
            "spans": table}


def span_lines(table: dict) -> list[str]:
    """The span table as text lines for stderr."""
    lines = [f"  {'span':<12} {'wall ms':>9} {'GPU-busy ms':>12} {'busy':>6}"]
    for name, row in table.items():
        busy = "-" if row["gpu_busy_ms"] is None else f"{row['gpu_busy_ms']:.3f}"
        share = "-" if row["gpu_busy_share"] is None else f"{100 * row['gpu_busy_share']:.0f}%"
        lines.append(f"  {name:<12} {row['wall_ms']:>9.3f} {busy:>12} {share:>6}")
    return lines


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", default=None, help="bfloat16 (default on cuda), float16 or float32 (default on cpu)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--budget", type=int, action="append", default=None, help="B (repeat for several)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="keep this many target layers (default all)")
    parser.add_argument("--record-rounds", type=int, default=0, help="also record this many rounds (M = 710)")
    parser.add_argument("--strategies", default="draft,reranked", help="strategies to time (draft, reranked)")
    parser.add_argument("--rerankers", default="rows", help="rerankers of the reranked strategy, each timed "
                        f"apart (comma-separated, from {', '.join(RERANKERS)})")
    parser.add_argument("--gbm-size", type=gbm_size, default=None, metavar="TREESxLEAVES@RATE",
                        help="the GBM rerankers' trees, leaves and learning rate (default: GBMReranker's; the "
                             "paper's is 400x63@0.05)")
    parser.add_argument("--warmup-rounds", type=int, default=3)
    parser.add_argument("--profile-rounds", type=int, default=0, help="also profile this many rounds of each "
                        "budget's first decoder: the operations of its host bookkeeping (PyTorch's profiler)")
    parser.add_argument("--graphs", choices=sorted(GRAPHS), default=None,
                        help="CUDA graphs for the draft and tree passes: on, off, or both (each budget's decoders "
                             "timed with and without them: 'budgets' holds the figures with, 'budgets_no_graphs' "
                             "without, 'graphs_speedup' the ratio); default both on cuda, off elsewhere")
    parser.add_argument("--max-bookkeeping-ms", type=float, default=5.0)
    parser.add_argument("--max-rerank-ms", type=float, default=0.15)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    import torch

    from specrank.decode.core import parse_device
    from specrank.decode.loading.targets import parse_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    device = parse_device(args.device)
    dtype = parse_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    start = time.perf_counter()
    torch.manual_seed(0)
    target = build_target(args.shape, device, dtype, args.layers)
    drafter = build_head(target, args.shape, device, dtype)
    strategies = [n for n in args.strategies.split(",") if n]
    kinds = [k for k in args.rerankers.split(",") if k]
    if unknown := [k for k in kinds if k not in RERANKERS] + [n for n in strategies if n not in ("draft", "reranked")]:
        parser.error(f"unknown strategy or reranker {unknown[0]!r}")
    rerankers = fit_rerankers(10, kinds, args.gbm_size) if "reranked" in strategies else {}
    # the Rows reranker keeps the plain name "reranked" (the figures of earlier runs read it so)
    names = [n for n in strategies if n != "reranked"] + [reranked_name(k) for k in rerankers]
    built = time.perf_counter() - start
    prompt = torch.randint(0, target.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "shape": args.shape, "target_layers": target.num_layers, "head_layers": list(drafter.hidden_layers),
              "dtype": str(dtype).removeprefix("torch."), "prompt_len": args.prompt_len,
              "threads": torch.get_num_threads(),
              "rounds": args.rounds, "build_seconds": built, "peak_mib_built": peak_memory_mib(device), "budgets": {},
              "gbm": {k: {p: getattr(rerankers[k], p) for p in ("n_estimators", "num_leaves", "learning_rate")}
                      for k in ("rows", "base") if k in rerankers},
              "reranker_share_of_round": {}}
    modes = GRAPHS[args.graphs or ("both" if device.type == "cuda" else "off")]
    result["graphs"] = args.graphs or ("both" if device.type == "cuda" else "off")
    use_graphs(target, drafter, modes[0])  # recording and profiling run with graphs on when any run is
    if args.record_rounds:
        reset_peak(device)
        result["record"] = record_rounds(target, drafter, prompt, args.record_rounds, 8, sync)
        result["record"]["peak_mib"] = peak_memory_mib(device)
    for budget in args.budget or [59, 8]:
        decoders = time_budget(args, result, (target, drafter, device, sync), names, rerankers, modes, budget, prompt)
        say_budget(result, budget, rerankers, decoders)
    mark_goals(args, result, names, rerankers)
    print(json.dumps(result, indent=2))
    # a CPU run (8B width, 2 layers) must not stand in for the GPU figures the docs quote
    write_results("bench_gpu" if device.type == "cuda" else f"bench_gpu_{device.type}_{args.shape}", result)
    return 0


def mark_goals(args, result: dict, names, rerankers: dict) -> None:
    """The goals and whether the worst host bookkeeping and the slowest reranker, over every budget, met them."""
    result["goals"] = {"bookkeeping_ms_per_round": args.max_bookkeeping_ms, "rerank_ms_per_round": args.max_rerank_ms}
    runs = [r for b in result["budgets"].values() for name, r in b.items() if name in names]
    worst = max(r["split"]["bookkeeping"] for r in runs)
    rerank = max((b[reranked_name(k)]["split"]["rerank"] for b in result["budgets"].values() for k in rerankers),
                 default=0.0)
    result["met"] = {"bookkeeping": worst <= args.max_bookkeeping_ms, "rerank": rerank <= args.max_rerank_ms}


def time_budget(args, result: dict, built: tuple, names, rerankers: dict, modes, budget: int, prompt) -> dict:
    """One budget's decoders timed in each graphs mode (``result``'s ``budgets``, ``budgets_no_graphs`` and
    ``graphs_speedup``), then profiled when asked (``bookkeeping_profile``): the decoders of the last mode timed."""
    target, drafter, device, sync = built
    for on in modes:  # graphs on first: "budgets" keeps the figures the docs read
        use_graphs(target, drafter, on)
        reset_peak(device)
        decoders = make_decoders(target, drafter, names, rerankers, budget)
        timed = time_decoders(decoders, prompt, args.rounds, args.warmup_rounds, sync)
        key = "budgets" if on == modes[0] else "budgets_no_graphs"
        result.setdefault(key, {})[budget] = timed | {"peak_mib": peak_memory_mib(device)}
    if len(modes) == 2:
        speedup = graphs_speedup(result["budgets"][budget], result["budgets_no_graphs"][budget], decoders)
        result.setdefault("graphs_speedup", {})[budget] = speedup
        print(f"B = {budget} graphs speedup (round ms without / with): "
              + ", ".join(f"{n} {x:.2f}x" for n, x in speedup.items()), file=sys.stderr)
        use_graphs(target, drafter, modes[0])
    if args.profile_rounds:
        first = next(iter(decoders))
        profiled = bookkeeping_profile(decoders[first], prompt, args.profile_rounds, sync)
        result.setdefault("bookkeeping_profile", {})[budget] = {"decoder": first, **profiled}
        print(f"B = {budget} {first}: {profiled['ops_per_round']:.0f} operations a round outside the spans, "
              f"{profiled['host_us_per_round'] / 1000:.2f} ms of host time", file=sys.stderr)
        print("\n".join(span_lines(profiled["spans"])), file=sys.stderr)
    return decoders


def say_budget(result: dict, budget: int, rerankers: dict, decoders: dict) -> None:
    """One budget's split on stderr: each reranker's share of the round (kept in ``reranker_share_of_round``) and
    draft selection's host bookkeeping."""
    for kind in rerankers:
        split = result["budgets"][budget][reranked_name(kind)]["split"]
        share = result["reranker_share_of_round"].setdefault(budget, {})
        share[kind] = split["rerank"] / split["total"]
        print(f"B = {budget} {kind}: reranker {split['rerank']:.3f} ms of a {split['total']:.2f} ms round "
              f"({100 * share[kind]:.2f}%), host bookkeeping {split['bookkeeping']:.2f} ms", file=sys.stderr)
    if "draft" in decoders:
        split = result["budgets"][budget]["draft"]["split"]
        print(f"B = {budget} draft: {split['total']:.2f} ms a round, host bookkeeping "
              f"{split['bookkeeping']:.2f} ms", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
