"""The vLLM half of the vLLM benchmarks (``bench_engine_parity.py``, ``bench_vllm_reranker.py``,
``bench_vllm_law.py``): run in vLLM's own environment (``make engine-parity`` builds it as ``.venv-vllm``), it decodes
the prompts of a request file with one engine setting and writes what it saw as JSON. It imports only vLLM and
``specrank.engines.vllm.metrics`` (found through the ``src/`` folder above it when run by path, which imports nothing
heavy), so neither environment needs the other's packages.

    .venv-vllm/bin/python src/specrank/engines/vllm/runner.py REQUEST.json OUT.json

REQUEST: ``{"model", "head" (null: plain decoding), "k", "prompts": [{"id", "ids", "seed"}], "max_tokens",
"temperatures", "mode"}``; optional ``"max_num_seqs"``. ``mode`` ``acceptance``: each temperature's prompts in one
batched ``generate``, with the global counters (``llm.get_metrics()``) before and after and each request's own per-step
counts; ``speed``: greedy, one prompt at a time after a warm-up, each timed twice (one token, then ``max_tokens``) so
the decode time excludes the prefill (with ``SPECRANK_RERANKER`` set, specrank's vLLM plugin runs and its own seconds
are reported; with ``"interleave": true`` as well, each prompt is decoded with the plugin off and on, in turns whose
order alternates, so both see the same engine and machine state); ``verify`` (with ``"widths": W``, ``"head": null``):
the target's forward and logits over 1..W tokens, each timed alone; ``law`` (with ``"samples": n``, optional
``"wrong_rule": "redraw"`` or ``"draft_rule": "second"``): the first prompt decoded ``n`` times at the first
temperature, seeds 0..n-1, in one batch, each decode's tokens (the law's check: ``bench_vllm_law.py``).

vLLM's CPU build (0.32.0 and, at the time of writing, its main branch: vllm-project/vllm#55005, open) samples
T > 0 rounds of speculative decoding from garbage: its CPU stand-in for ``expand_kernel`` fills an int64 copy of
the per-token temperature buffer and returns the uninitialized original, so the rejection sampler divides the
target's logits by uninitialized memory and accepts almost nothing. ``acceptance`` runs each T > 0 twice, as
shipped and with ``expand_batch_to_tokens`` replaced by the same expansion in plain torch (``fixed_expand``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if not __package__:
    # Run by path, Python puts this folder first on the path, where plugin.py and metrics.py would shadow any
    # top-level modules of those names; the src/ folder instead, so specrank needs no install in vLLM's environment.
    sys.path[0] = str(Path(__file__).resolve().parents[3])

from specrank.engines.vllm.metrics import metric_records  # noqa: E402  (after the path to src/)
from specrank.law import Law  # noqa: E402


def engine(request: dict):
    from vllm import LLM

    kwargs = {"model": request["model"], "dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
              # the model's generation_config.json would change the sampling defaults: every request names its own
              "generation_config": "vllm", "seed": 0, "disable_log_stats": False,
              # on the CPU backend this is the share of host memory reserved (KV cache and all)
              "gpu_memory_utilization": float(request.get("memory_share", 0.15)),
              # every prompt of a batch prefilled whole: a prompt split over two steps makes the CPU build rewind
              # its seeded generator, which a CPU torch.Generator cannot ("does not use offset")
              "max_num_batched_tokens": 32768}
    if request.get("max_num_seqs"):
        kwargs["max_num_seqs"] = int(request["max_num_seqs"])
    if request.get("head"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": request["head"],
                                        "num_speculative_tokens": int(request["k"])}
        kwargs["per_request_spec_decode_metrics"] = "detailed"
    return LLM(**kwargs)


def sampling(temperature: float, max_tokens: int, seed: int | None):
    from vllm import SamplingParams

    # every filter off: specrank's law at T is the target's softmax at T, nothing cut
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, top_p=1.0, top_k=-1, min_p=0.0,
                          seed=None if Law(temperature).greedy else seed)


def request_metrics(completion) -> dict | None:
    m = getattr(completion, "spec_decode_metrics", None)
    if m is None:
        return None
    return {"histogram": list(m.histogram), "num_draft_tokens": int(m.num_draft_tokens),
            "per_step_accepted": list(m.per_step_accepted), "per_step_drafted": list(m.per_step_drafted)}


def fixed_expand(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """``rejection_sampler.expand_batch_to_tokens`` in plain torch: each request's value repeated over its tokens,
    ``replace_from`` replaced by ``replace_to`` (what the Triton kernel computes on a GPU)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = x.repeat_interleave(counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def cpu_expand(fixed: bool) -> None:
    """Install the shipped or the fixed expansion (``apply_sampling_constraints`` looks it up at each call)."""
    import vllm.v1.sample.rejection_sampler as rs

    shipped = getattr(rs, "_shipped_expand", rs.expand_batch_to_tokens)
    rs._shipped_expand = shipped
    rs.expand_batch_to_tokens = fixed_expand if fixed else shipped


def acceptance(llm, request: dict) -> list[dict]:
    out = []
    runs = [(t, False) for t in request["temperatures"]]
    if request.get("head"):  # plain decoding has no rejection sampler to fix
        runs += [(t, True) for t in request["temperatures"] if t > 0]
    for temperature, fixed in runs:
        cpu_expand(fixed)
        prompts = [{"prompt_token_ids": p["ids"]} for p in request["prompts"]]
        params = [sampling(temperature, request["max_tokens"], p["seed"]) for p in request["prompts"]]
        before = metric_records(llm.get_metrics())
        start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        after = metric_records(llm.get_metrics())
        out.append({"temperature": temperature, "cpu_expand_fixed": fixed, "seconds": seconds,
                    "metrics_before": before, "metrics_after": after,
                    "requests": [{"id": p["id"], "tokens": list(r.outputs[0].token_ids),
                                  "finish_reason": r.outputs[0].finish_reason,
                                  "spec": request_metrics(r.outputs[0])}
                                 for p, r in zip(request["prompts"], results, strict=True)]})
    return out


def speed(llm, request: dict) -> list[dict]:
    first = {"prompt_token_ids": request["prompts"][0]["ids"]}
    llm.generate([first], sampling(0.0, request["max_tokens"], None), use_tqdm=False)  # warm-up
    if not request.get("interleave"):
        return [{"id": p["id"], **timed(llm, p, request["max_tokens"])} for p in request["prompts"]]
    from specrank.engines.vllm import plugin  # the plugin and its reranker's libraries: only where a run asks for it

    rows = []
    for i, p in enumerate(request["prompts"]):
        row = {"id": p["id"]}
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            plugin.set_active(on)
            row["on" if on else "off"] = timed(llm, p, request["max_tokens"])
        rows.append(row)
    plugin.set_active(True)
    return rows


def timed(llm, p: dict, max_tokens: int) -> dict:
    """One prompt's greedy decode, timed without its prefill, with the engine's counters around it."""
    prompt = {"prompt_token_ids": p["ids"]}
    start = time.perf_counter()
    llm.generate([prompt], sampling(0.0, 1, None), use_tqdm=False)
    prefill = time.perf_counter() - start
    before = metric_records(llm.get_metrics())
    start = time.perf_counter()
    result = llm.generate([prompt], sampling(0.0, max_tokens, None), use_tqdm=False)
    seconds = time.perf_counter() - start
    after = metric_records(llm.get_metrics())
    return {"seconds": seconds, "prefill_seconds": prefill, "tokens": len(result[0].outputs[0].token_ids),
            "token_ids": list(result[0].outputs[0].token_ids), "metrics_before": before, "metrics_after": after}


def law(llm, request: dict) -> list[list[int]]:
    """The first prompt decoded ``samples`` times (seeds 0..n-1) at the first temperature, the CPU expansion fixed;
    with ``wrong_rule`` the rejection rule is broken first (``redraw_after_rejection``)."""
    cpu_expand(True)
    prompt = {"prompt_token_ids": request["prompts"][0]["ids"]}
    n, temperature = int(request["samples"]), float(request["temperatures"][0])
    params = [sampling(temperature, request["max_tokens"], seed) for seed in range(n)]
    results = llm.generate([prompt] * n, params, use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in results]


def redraw_after_rejection() -> None:
    """Deliberately wrong, the negative control of the law's check: when a chain's first draft token is rejected,
    the token emitted instead is drawn afresh from the target's whole row (the rejected token included) rather
    than from the residual vLLM's rejection sampler draws from. Installed before the engine is built, under the
    plugin's own wrapper."""
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._sample

    def sample(self, logits, spec_decode_metadata, *args, **kwargs):
        kept = None if spec_decode_metadata is None or logits is None else logits.clone()
        out = original(self, logits, spec_decode_metadata, *args, **kwargs)
        if kept is None:
            return out
        row, draft = 0, 0  # each request's first verify row and first draft token
        for i, count in enumerate(spec_decode_metadata.num_draft_tokens):
            if count and out.sampled_token_ids[i, 0] != spec_decode_metadata.draft_token_ids[draft]:
                out.sampled_token_ids[i, 0] = int(torch.multinomial(torch.softmax(kept[row].float(), -1), 1))
            row, draft = row + count + 1, draft + count
        return out

    GPUModelRunner._sample = sample


def second_choice() -> None:
    """The plugin drafting every chain's first token as the head's second choice (its chooser replaced; its hooks
    and rows as they are): a rule far from the head's own, moving every first token, which keeps vLLM's law as any
    drafted token does."""
    import torch

    from specrank.engines.vllm.chooser import ChainChooser  # torch and the device rerankers: the law check's alone

    def choose(self, request_ids, logits, root, prompt_len, position):
        return torch.topk(logits, 2, dim=-1).indices[:, 1]

    ChainChooser.choose = choose


def verify_passes(llm, request: dict) -> dict:
    """The target's forward pass and logits over n tokens, n = 1..``widths``, timed alone in the engine: the
    fastest of ``repeats`` after a warm-up (ms). vLLM's own dummy batch (``GPUModelRunner._dummy_run``, which the
    CPU runner inherits; vLLM 0.32 ``v1/worker/gpu_model_runner.py``) runs the same kernels a verify pass over n
    tokens runs, on the same thread pool."""
    import torch

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner

    def once(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            hidden = runner._dummy_run(n)[0]
            runner.model.compute_logits(hidden[:n])
        return time.perf_counter() - start

    widths = range(1, int(request["widths"]) + 1)
    for n in widths:
        once(n)
    return {str(n): 1000 * min(once(n) for _ in range(int(request.get("repeats", 15)))) for n in widths}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) != 2 or not Path(argv[0]).is_file():
        print(f"runner.py: expected REQUEST.json OUT.json, got {' '.join(argv) or 'nothing'}",
              file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    import vllm

    if request.get("wrong_rule") == "redraw":
        redraw_after_rejection()
    if request.get("draft_rule") == "second":
        second_choice()
    llm = engine(request)
    result = {"vllm": vllm.__version__, "k": request.get("k"), "head": request.get("head"), "mode": request["mode"],
              "threads": os.environ.get("OMP_NUM_THREADS"), "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}
    if request["mode"] == "verify":
        result["verify_ms"] = verify_passes(llm, request)
    elif request["mode"] == "law":
        result["tokens"] = law(llm, request)
    else:
        result["runs" if request["mode"] == "acceptance" else "speed"] = (
            acceptance(llm, request) if request["mode"] == "acceptance" else speed(llm, request))
    result["plugin"] = plugin_timing()
    Path(argv[1]).write_text(json.dumps(result))
    return 0


def plugin_timing() -> dict | None:
    """specrank's vLLM plugin, when ``SPECRANK_RERANKER`` enabled it in this process: its calls and their seconds
    (a choice before each chain, a retain after each verify pass)."""
    if not os.environ.get("SPECRANK_RERANKER"):
        return None
    from specrank.engines.vllm import plugin  # loaded by vLLM already where SPECRANK_RERANKER enabled it

    seconds = [] if plugin.CHOOSER is None else plugin.CHOOSER.seconds
    return {"calls": len(seconds), "seconds": float(sum(seconds))}


if __name__ == "__main__":  # vLLM's engine starts worker processes that import this module again
    sys.exit(main())
