"""The training-time test: the head run over whole sequences for ``k`` drafting steps at once.

Step 0 reads the target's fused states; step ``j`` reads the head's own step ``j-1`` output at
the same index, exactly as a depth-``j`` tree node reads its parent's output at inference
(``specrank.decode.loading.eagle3``). A step-``j`` query at index ``i`` sees the step-0 keys
at indices ``<= i`` (the committed context and the root) and the step-``1..j`` keys at index
``i`` (its own ancestors in the tree), with position id ``i + j``.

This calls the submodules of ``Eagle3Head`` with a batch axis; its own ``forward`` takes one
sequence, which is all drafting needs.
"""

from __future__ import annotations

import torch


def ttt_mask(width: int, step: int) -> torch.Tensor:
    """(width, (step + 1) * width) additive mask of unrolled ``step`` over the keys of steps 0..step."""
    eye = torch.eye(width, dtype=torch.bool)
    causal = torch.ones(width, width, dtype=torch.bool).tril_()
    allowed = torch.cat([causal] + [eye] * step, dim=1)
    return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))


def unrolled_logits(head, batch, steps: int) -> list[torch.Tensor]:
    """Draft-vocabulary logits (B, L, Vd) of each unrolled step 0..steps-1."""
    from transformers import DynamicCache

    width = batch.features.shape[1]
    cache = DynamicCache(config=head.config)
    hidden = head.project(batch.features)  # (B, L, H)
    index = torch.arange(width, device=hidden.device)
    outs = []
    for j in range(steps):
        embeds = head.embed_tokens(batch.tokens[:, j : j + width]).to(hidden.dtype)  # (B, L, H)
        rope = head.rotary_emb(hidden, (index + j)[None])
        mask = ttt_mask(width, j).to(hidden.device, hidden.dtype)[None, None]
        logits, hidden = head.read_out(head.midlayer(embeds, hidden, rope, mask, cache))  # (B, L, Vd), (B, L, H)
        outs.append(logits)
    return outs
