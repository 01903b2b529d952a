"""SGLang's tree verification at T > 0, for its CPU engine (``bench_sglang.py --sampling-verify``; docs/sglang.md).

SGLang v0.5.18's ``eagle_sample`` (``srt/speculative/eagle_utils.py``) verifies greedily on a CPU at every
temperature: its sampling branch calls ``sgl_kernel.tree_speculative_sampling_target_only``, a CUDA kernel
(``kernels/aot/csrc/speculative/speculative_sampling.cuh``, ``TreeSpeculativeSamplingTargetOnly``) that the CPU
kernel package does not build. ``tree_speculative_sampling_target_only`` below is that kernel in torch, step for
step, for one request at a time; ``around_eagle_sample`` lets ``eagle_sample`` take its sampling branch on the CPU
and hands it this function. Everything else in the branch (temperature, top-k/top-p renormalisation, the coins, what
it returns) is SGLang's own code.

The kernel's rule, per request: from the root, the children of the last accepted node are tried in SGLang's sibling
order with one coin ``u`` for the level; a child ``x`` is accepted once the target mass of the children tried so far
reaches ``u`` (or ``p(x) >= threshold_single``; at the defaults, 1, never alone). A rejected child's mass is moved
into ``draft_probs`` at its parent's row. The token after the last accepted node is drawn from ``relu(p - draft)`` at
that node's row (the target with the rejected children removed) by inverse CDF with the final coin. At the default
thresholds the emitted tokens follow the target's law exactly (``tests/test_sglang_runs.py`` checks it, and that a
lossy threshold fails).
"""

from __future__ import annotations

import torch


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True) -> None:
    """The kernel's outputs written in place: ``predicts`` (bs * n,) the token after each accepted node (flat
    ``retrive_index`` slots), ``accept_index`` (bs, depth) the accepted slots, root first, ``accept_token_num`` (bs,)
    the accepted drafts; ``draft_probs`` (bs, n, V) receives the rejected children's mass. Shapes as SGLang's:
    ``candidates`` (bs, n) the tree's tokens, node 0 the root; ``uniform_samples`` (bs, n) a coin per node."""
    bs, n = candidates.shape
    depth = accept_index.shape[1]
    for b in range(bs):
        node, coin, mass, accepted = 0, float(uniform_samples[b, 0]), 0.0, 0
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        for _ in range(1, depth):
            child = int(retrive_next_token[b, node])
            while child != -1:
                token = int(candidates[b, child])
                p = float(target_probs[b, node, token])
                mass += p
                if coin <= mass / threshold_acc or p >= threshold_single:
                    mass, coin = 0.0, float(uniform_samples[b, child])
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = retrive_index[b, child]
                    last, node = int(retrive_index[b, child]), child
                    break
                draft_probs[b, node, token] = target_probs[b, node, token]
                child = int(retrive_next_sibling[b, child])
            if child == -1:
                break
        accept_token_num[b] = accepted
        q = target_probs[b, node].double()
        residual = q if accepted == depth - 1 else (q - draft_probs[b, node].double()).clamp(min=0)
        predicts[last] = sample_inverse_cdf(residual, float(uniform_samples_for_final_sampling[b]))


def sample_inverse_cdf(weights: torch.Tensor, coin: float) -> int:
    """The kernel's ``DeviceSamplingFromProb``: the first token whose running sum of ``weights`` exceeds ``coin``
    times their total, among tokens of positive weight; past the end, the last such token (or the last token)."""
    positive = weights > 0
    if not bool(positive.any()):
        return weights.numel() - 1
    above = torch.nonzero((weights.cumsum(0) > coin * weights.sum()) & positive)
    return int(above[0]) if len(above) else int(torch.nonzero(positive)[-1])


def around_eagle_sample(original, verify_input, batch, logits_output, grammar_mask=None):
    """SGLang's ``eagle_sample`` (``original``) with its sampling branch taken on the CPU for a batch that samples:
    ``_is_cpu`` reads False for the call, and ``sgl_kernel`` holds the torch kernel above."""
    if batch.sampling_info.is_all_greedy:
        return original(verify_input, batch, logits_output, grammar_mask)
    import sgl_kernel  # SGLang's CPU kernel package and SGLang itself: inside the engine's process
    from sglang.srt.speculative import eagle_utils

    sgl_kernel.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only
    saved = eagle_utils._is_cpu
    eagle_utils._is_cpu = False
    try:
        return original(verify_input, batch, logits_output, grammar_mask)
    finally:
        eagle_utils._is_cpu = saved
