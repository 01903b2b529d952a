"""Measure the SGLang plugin's own work per verify step (docs/sglang.md), without SGLang: rescoring a draft tree and
keeping the verify pass's rows, each timed on its own.

    python benchmarks/bench_sglang_plugin_cost.py                 # the champion's setting, one torch thread
    python benchmarks/bench_sglang_plugin_cost.py --steps 50      # a smoke run

The rescorer is built as ``plugin.load_rescorer`` builds it, with ``reranker:default`` at ``--temperature`` (the
shipped champion is trained for topk 10). Each step hands the plugin's hooks (``engines.sglang.hooks``) what SGLang
v0.5.18 hands them at the champion's setting of ``bench_sglang.py`` (batch 1, ``--speculative-eagle-topk 10
--speculative-num-steps 3 --speculative-num-draft-tokens 9``, SmolLM2's vocabulary of 49,152): ``organize_draft_
results``' score, token and parent lists as ``select_top_k_tokens`` builds them, and ``eagle_sample``'s outputs
with float32 target logits (n, V). Trees and rows are synthetic: peaked draft probabilities, tokens drawn from a
Zipf law over a few thousand; a request stores about 4 new tokens' rows a step, and its next root has a stored row
at 2 steps in 5 and is a token just verified at 1 in 20, as in SmolLM2's recorded rounds read as an engine sees
them (no prompt rows). A request decodes ``--request-steps`` verify steps (about a 48-token answer), then the next
begins; the steps are made one at a time, between the timed calls (which, like SGLang's forward passes, leaves
the caches cold), and a finished request's ``Req`` is let go, as SGLang lets it go.

Rescoring: the ``organize_draft_results`` hook less SGLang's own function (the draft hook's request list, the tree
read from the tensors, the plugin's scores, the chosen tree remembered). Retention: ``hooks.retain_batch``. Medians
over ``--steps`` steps after ``--warmup``, and the mean count of page faults in both (a new tensor of a few hundred
KB is new memory to the host: a fault per 4 KB, each costing more than copying the page). Writes ``benchmarks/results/sglang_plugin_cost.json`` (``--name``) with
``lscpu``'s model name, the load average before and after (the machine is shared), and the goal: at most 1 ms a
step for both together.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from types import SimpleNamespace

import numpy as np

from harness import cpu_model, write_results  # benchmarks/harness.py, beside this script

TOPK, NUM_STEPS, DRAFT_TOKENS = 10, 3, 9  # bench_sglang.py's champion_b8 setting
VOCAB = 49_152  # SmolLM2
POPULAR, ZIPF = 4000, 1.3  # drafted tokens: a Zipf law over POPULAR tokens
GOAL_MS = 1.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--reranker", default="reranker:default", help="as SPECRANK_RERANKER names it")
    parser.add_argument("--temperature", type=float, default=0.0, help="the law, as SPECRANK_TEMPERATURE")
    parser.add_argument("--steps", type=int, default=400, help="timed verify steps")
    parser.add_argument("--warmup", type=int, default=40, help="untimed steps first (numba compiles, caches fill)")
    parser.add_argument("--request-steps", type=int, default=30, help="verify steps of one request")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="sglang_plugin_cost", help="benchmarks/results/NAME.json")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.request_steps < 1:
        parser.exit(2, "--steps and --request-steps: positive; --warmup: not negative\n")
    return args


def top_probabilities(rng, n: int) -> np.ndarray:
    """(n, TOPK) a draft head's top-k probabilities, best first: peaked, as a trained head's are."""
    mass = rng.gamma(0.2, size=(n, 4 * TOPK)) + 1e-6
    return -np.sort(-mass / mass.sum(1, keepdims=True), axis=1)[:, :TOPK].astype(np.float32)


def top_tokens(rng, n: int, popular: np.ndarray) -> np.ndarray:
    """(n, TOPK) distinct tokens per row, drawn from a Zipf law over ``popular``."""
    out = np.empty((n, TOPK), np.int64)
    for i in range(n):
        pick = np.minimum(rng.zipf(ZIPF, 3 * TOPK), len(popular)) - 1
        pick = np.concatenate([pick, rng.choice(len(popular), 2 * TOPK, replace=False)])
        out[i] = popular[pick[np.sort(np.unique(pick, return_index=True)[1])][:TOPK]]  # first draws first
    return out


def draft_lists(rng, popular: np.ndarray):
    """One request's ``organize_draft_results`` inputs (score_list, token_list, parents_list), built as SGLang's
    ``select_top_k_tokens`` builds them: step 0 the first level, each later step the k x k children of the k best
    cumulative scores."""
    import torch

    p = top_probabilities(rng, 1 + (NUM_STEPS - 1) * TOPK)
    tok = top_tokens(rng, 1 + (NUM_STEPS - 1) * TOPK, popular)
    scores = torch.from_numpy(p[0])[None]  # (1, k)
    score_list, token_list = [scores[:, None]], [torch.from_numpy(tok[0])[None]]
    parents_list = [torch.arange(-1, TOPK)[None]]
    for i in range(1, NUM_STEPS):
        rows = slice(1 + (i - 1) * TOPK, 1 + i * TOPK)
        expand = scores[:, :, None] * torch.from_numpy(p[rows])[None]  # (1, k, k)
        score_list.append(expand)
        token_list.append(torch.from_numpy(tok[rows]).reshape(1, -1))
        scores, index = torch.topk(expand.flatten(1), TOPK, dim=-1)
        parents_list.append(index + TOPK * TOPK * (i - 1) + TOPK)
    return score_list, token_list, parents_list


def organize_draft_results(score_list, token_list, parents_list, num_draft_token):
    """SGLang v0.5.18's ``organize_draft_results`` (``speculative/eagle_utils.py``), which the hook wraps."""
    import torch

    score = torch.cat(score_list, dim=1).flatten(1)
    tokens = torch.cat(token_list, dim=1)
    index = torch.sort(torch.topk(score, num_draft_token - 1, dim=-1).indices).values
    draft_tokens = torch.gather(tokens, index=index, dim=1)
    return torch.cat(parents_list[:-1], dim=1), index, draft_tokens


def continuation(rng, popular: np.ndarray, verified: np.ndarray, earlier: set) -> int:
    """The token emitted after the accepted path, as often as in SmolLM2's recorded rounds read as an engine sees
    them: one of the tokens just verified at one step in twenty (the same-token row held), one verified at an
    earlier step of the request at about one in three (a stored row read), else one not verified yet."""
    u, old = rng.random(), sorted(earlier - set(verified.tolist()))
    if u < 0.05:
        return int(rng.choice(verified))
    if u < 0.4 and old:
        return int(rng.choice(old))
    return int(popular[rng.integers(len(popular))])


def accepted_path(rng, chosen: np.ndarray, parent: np.ndarray) -> list[int]:
    """Slots of an accepted path through the verified tree (slot 0 the root, slot 1 + j the j-th chosen node):
    each node accepted with probability 0.6, its best-placed verified child next."""
    path, node = [0], -1
    while rng.random() < 0.6:
        children = [j for j, c in enumerate(chosen) if parent[c] == node]
        if not children:
            break
        path.append(1 + children[0])
        node = int(chosen[children[0]])
    return path


class Request:
    """SGLang's ``Req`` as the hooks read it; let go after its last step, as SGLang lets a finished request go."""

    def __init__(self, rid: str):
        self.rid, self.output_ids, self.origin_input_ids = rid, [], [0] * 64
        self.verified: set[int] = set()  # tokens of its verified trees so far


class Step:
    """What one verify step hands the plugin, made before it is timed."""

    def __init__(self, rng, popular, req: Request, root: int, position: int, logits):
        import torch

        self.lists = draft_lists(rng, popular)
        self.req, self.root, self.position, self.logits = req, root, position, logits
        score = torch.cat(self.lists[0], dim=1).flatten(1)
        self.parent = np.full(score.shape[1], -1, np.int64)
        for i in range(1, NUM_STEPS):
            frontier = self.lists[2][i - 1][0, -TOPK:].numpy()
            self.parent[TOPK + (i - 1) * TOPK * TOPK: TOPK + i * TOPK * TOPK] = np.repeat(frontier, TOPK)
        self.continuation = -1  # drawn once the tree is verified
        self.rng, self.popular = rng, popular

    def batch(self):
        import torch

        self.req.output_ids = list(range(self.position))
        return SimpleNamespace(reqs=[self.req], spec_info=SimpleNamespace(bonus_tokens=torch.tensor([self.root])),
                               forward_mode=SimpleNamespace(is_idle=lambda: False))

    def verify(self, draft_tokens, chosen):
        """``eagle_sample``'s verify input and outputs for the tree SGLang chose: (verify_input, out)."""
        import torch

        path = accepted_path(self.rng, chosen, self.parent)
        draft = torch.cat([torch.tensor([self.root]), draft_tokens.reshape(-1)])
        self.continuation = continuation(self.rng, self.popular, draft.numpy(), self.req.verified)
        self.req.verified.update(draft.tolist())
        predict = torch.zeros(DRAFT_TOKENS, dtype=torch.int32)
        predict[path[-1]] = self.continuation
        index = torch.full((1, NUM_STEPS + 1), -1, dtype=torch.int32)
        index[0, : len(path)] = torch.tensor(path, dtype=torch.int32)
        verify_input = SimpleNamespace(draft_token_num=DRAFT_TOKENS, draft_token=draft)
        return verify_input, (predict, torch.tensor([len(path)], dtype=torch.int32), index)


def steps(args, n: int):
    """``n`` verify steps, one at a time, of requests of ``--request-steps`` steps each, each root the step before's
    continuation (a generator: a request's ``Request`` is let go once its steps are done)."""
    import torch

    rng = np.random.default_rng(args.seed)
    popular = rng.choice(VOCAB, POPULAR, replace=False)
    logits = [torch.randn(DRAFT_TOKENS, VOCAB, generator=torch.Generator().manual_seed(i)) * 3 for i in range(8)]
    root = int(popular[0])
    for i in range(n):
        if i % args.request_steps == 0:
            req = Request(f"r{i // args.request_steps}")
        step = Step(rng, popular, req, root, i % args.request_steps, logits[i % 8])
        yield step
        root = step.continuation  # drawn while the step ran


def faults() -> int:
    """Minor page faults of this process so far: the first touch of each new 4 KB page."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_step(rescorer, step: Step) -> tuple[float, float, int]:
    """One step through the plugin's hooks: (rescoring seconds, retention seconds, page faults in both)."""
    from specrank.engines.sglang import hooks

    inner = {}

    def organize(*args, **kwargs):  # SGLang's function, its own time left out
        start = time.perf_counter()
        inner["out"] = organize_draft_results(*args, **kwargs)
        inner["seconds"] = time.perf_counter() - start
        return inner["out"]

    organize_hook = hooks.around_organize(rescorer)

    def draft(self, batch):  # SGLang's draft: its forward passes, then organize_draft_results
        return organize_hook(organize, *step.lists, DRAFT_TOKENS)

    batch = step.batch()
    touched = faults()
    start = time.perf_counter()
    hooks.around_draft(rescorer)(draft, None, batch)
    rescoring = time.perf_counter() - start - inner["seconds"]
    touched -= faults()
    _, index, draft_tokens = inner["out"]
    verify_input, out = step.verify(draft_tokens, index[0].numpy())
    touched += faults()
    start = time.perf_counter()
    hooks.retain_batch(rescorer, verify_input, batch, step.logits, out)
    retention = time.perf_counter() - start
    return rescoring, retention, faults() - touched


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from specrank.engines.sglang.plugin import load_rescorer

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    rescorer = load_rescorer({"SPECRANK_RERANKER": args.reranker, "SPECRANK_TEMPERATURE": f"{args.temperature:g}"})
    runs = np.array([run_step(rescorer, s) for s in steps(args, args.warmup + args.steps)])[args.warmup:]
    times, touched = runs[:, :2] * 1000, runs[:, 2]
    total = times.sum(1)
    figures = {"cpu_model": cpu_model(), "threads": args.threads, "reranker": args.reranker,
               "inference": rescorer.strategy.compiled.inference, "temperature": args.temperature,
               "topk": TOPK, "num_steps": NUM_STEPS, "num_draft_tokens": DRAFT_TOKENS, "vocab": VOCAB, "batch": 1,
               "steps": args.steps, "warmup": args.warmup, "request_steps": args.request_steps,
               "rescoring_ms": float(np.median(times[:, 0])), "retention_ms": float(np.median(times[:, 1])),
               "total_ms": float(np.median(total)), "total_p90_ms": float(np.quantile(total, 0.9)),
               "page_faults_per_step": float(touched.mean()),
               "load_average_before": load_before, "load_average_after": os.getloadavg()[0], "goal_ms": GOAL_MS}
    figures["meets_goal"] = figures["total_ms"] <= GOAL_MS
    path = write_results(args.name, figures, argv)
    print(f"rescoring {figures['rescoring_ms']:.3f} ms, retention {figures['retention_ms']:.3f} ms, total"
          f" {figures['total_ms']:.3f} ms a step (median; goal {GOAL_MS} ms), {figures['page_faults_per_step']:.0f}"
          f" page faults a step: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
