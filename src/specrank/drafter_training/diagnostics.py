"""Where a head's first-token agreement is lost: agreement binned by the target's own confidence,
with the share of rows whose target argmax is outside the draft vocabulary.

A head that generalises agrees most where the target is sure of its next token; comparing the
bins on held-out and training rows separates what the head learnt from what it memorised.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from specrank.drafter_training.batches import collate, windows
from specrank.drafter_training.objective import agrees
from specrank.drafter_training.unroll import unrolled_logits

CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)


@torch.no_grad()
def first_token_rows(head, corpus, slices, ids, lm_head, max_len: int = 512, batch_size: int = 8) -> dict:
    """Per response row of ``slices``: ``agree`` (head top-1 is the target argmax), ``confidence``
    (the target's top-1 probability over its full vocabulary) and ``in_vocab`` (the argmax has a
    draft id), each (n,)."""
    was_training = head.training
    head.eval()
    agree, confidence, in_vocab = [], [], []
    wins = windows(slices, max_len)
    for k in range(0, len(wins), batch_size):
        batch = collate(corpus, wins[k : k + batch_size], 1).to(ids.device)
        draft = unrolled_logits(head, batch, 1)[0]  # (B, L, Vd)
        valid = batch.valid(0, response_only=True)
        argmax = batch.argmax[:, : draft.shape[1]][valid]
        logits = lm_head(batch.last[:, : draft.shape[1]][valid])  # (n, V)
        confidence.append(torch.softmax(logits.float(), -1).amax(-1))
        agree.append(agrees(draft[valid], argmax, ids))
        in_vocab.append(torch.isin(argmax, ids))
    head.train(was_training)
    if not agree:
        empty = torch.zeros(0)
        return {"agree": empty.bool(), "confidence": empty, "in_vocab": empty.bool()}
    return {"agree": torch.cat(agree), "confidence": torch.cat(confidence), "in_vocab": torch.cat(in_vocab)}


def agreement_by_confidence(rows: dict, edges=CONFIDENCE_EDGES) -> list[dict]:
    """One dict per confidence bin [lo, hi) (the last bin includes hi): share of rows, agreement,
    share in the draft vocabulary and agreement on those; then an ``all`` row."""
    conf, agree, inv = rows["confidence"], rows["agree"].float(), rows["in_vocab"]
    n = max(1, len(conf))
    bins = torch.bucketize(conf, torch.tensor(edges[1:-1], dtype=conf.dtype), right=True)  # (n,) in 0..len(edges)-2

    def summary(label, mask):
        m = int(mask.sum())
        both = mask & inv
        return {
            "bin": label,
            "rows": m,
            "share": m / n,
            "agreement": float(agree[mask].mean()) if m else float("nan"),
            "in_vocab": float(inv[mask].float().mean()) if m else float("nan"),
            "agreement_in_vocab": float(agree[both].mean()) if int(both.sum()) else float("nan"),
        }

    out = [summary(f"[{lo:.1f}, {hi:.1f}{']' if i == len(edges) - 2 else ')'}", bins == i)
           for i, (lo, hi) in enumerate(pairwise(edges))]
    return out + [summary("all", torch.ones_like(inv))]


def format_table(title: str, table: list[dict]) -> str:
    """The bins of ``agreement_by_confidence`` as aligned text."""
    lines = [title, "target top-1 prob    rows  share  agree  in vocab  agree | in vocab"]
    for r in table:
        lines.append(f"{r['bin']:<17} {r['rows']:7d}  {r['share']:.3f}  {r['agreement']:.3f}     "
                     f"{r['in_vocab']:.3f}             {r['agreement_in_vocab']:.3f}")
    return "\n".join(lines)
