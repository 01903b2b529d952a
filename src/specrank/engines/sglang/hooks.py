"""SGLang's side of the plugin: the functions ``register`` wraps with SGLang's ``HookRegistry`` (SGLang PR #21388,
``python/sglang/srt/plugins/hook_registry.py``: an AROUND hook replaces the function in every module that imported
it by name). Names are SGLang v0.5.18's; everything here reads SGLang's objects by attribute and hands numpy and
torch values to ``rescorer.TreeRescorer``.

- ``EagleDraftWorker.draft`` (``speculative/eagle_worker_v2.py``): the batch's requests, kept for the draft step.
- ``organize_draft_results`` (``speculative/eagle_utils.py``): SGLang's global top-(n - 1) over the flattened path
  scores; called with the plugin's scores instead, its tokens and parents unchanged.
- ``eagle_sample`` (``speculative/eagle_utils.py``, called from ``eagle_worker_common.run_eagle_verify``): after
  SGLang verified, each request's target rows are kept.
"""

from __future__ import annotations

import contextvars
import logging

import numpy as np
import torch

from specrank.engines.sglang.layout import draft_tree, host
from specrank.engines.sglang.rescorer import DraftRequest, TreeRescorer

logger = logging.getLogger(__name__)
DRAFT = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"
ORGANIZE = "sglang.srt.speculative.eagle_utils.organize_draft_results"
SAMPLE = "sglang.srt.speculative.eagle_utils.eagle_sample"
_requests: contextvars.ContextVar[list | None] = contextvars.ContextVar("specrank_sglang_requests", default=None)


def draft_requests(batch, rescorer: TreeRescorer) -> list[DraftRequest]:
    """The batch's requests as the draft step sees them; the root is the bonus token SGLang drafts from."""
    bonus = getattr(getattr(batch, "spec_info", None), "bonus_tokens", None)
    roots = None if bonus is None else host(bonus).reshape(-1)
    out = []
    for b, req in enumerate(batch.reqs):
        output = list(getattr(req, "output_ids", []) or [])
        root = int(roots[b]) if roots is not None and b < len(roots) else (output[-1] if output else -1)
        out.append(DraftRequest(str(req.rid), root, len(req.origin_input_ids), len(output), req))
    return out


def around_draft(rescorer: TreeRescorer):
    def hook(original, self, batch, *args, **kwargs):
        token = _requests.set(draft_requests(batch, rescorer))
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            _requests.reset(token)
    return hook


def around_organize(rescorer: TreeRescorer):
    def hook(original, score_list, token_list, parents_list, num_draft_token, *args, **kwargs):
        requests = _requests.get()
        if requests is None or len(requests) != token_list[0].shape[0]:  # not a draft step the plugin saw
            return original(score_list, token_list, parents_list, num_draft_token, *args, **kwargs)
        tree = draft_tree(score_list, token_list, parents_list)
        score = rescorer.score(tree, requests)  # (b, C) float64
        ranked = torch.from_numpy(score).to(score_list[0].device).view(len(requests), 1, -1)
        out = original([ranked], token_list, parents_list, num_draft_token, *args, **kwargs)
        rescorer.remember(requests, host(out[1]), score)  # out: parent_list, top_scores_index, draft_tokens
        return out
    return hook


def around_sample(rescorer: TreeRescorer):
    def hook(original, verify_input, batch, logits_output, *args, **kwargs):
        out = original(verify_input, batch, logits_output, *args, **kwargs)
        if not batch.forward_mode.is_idle():
            retain_batch(rescorer, verify_input, batch, logits_output.next_token_logits, out)
        return out
    return hook


def retain_batch(rescorer: TreeRescorer, verify_input, batch, logits: torch.Tensor, out) -> None:
    """Each request's verify rows into its caches. ``out`` is ``eagle_sample``'s (predict, accept_lens,
    accept_index): predict (b * n,) the token emitted at each global slot; accept_lens (b,) the accepted slots
    counted with the root (SGLang v0.5.18 returns its ``num_correct_drafts + 1``); accept_index (b, depth + 1)
    the accepted path's global slots, root first, -1 padded."""
    predict, lengths, accept_index = (host(t) for t in out)
    n = int(verify_input.draft_token_num)
    tokens = host(verify_input.draft_token).reshape(-1, n).astype(np.int64)
    rows = logits.view(-1, n, logits.shape[-1])
    for b, req in enumerate(batch.reqs):
        path = accept_index[b, : int(lengths[b])].astype(np.int64)
        rescorer.retain(str(req.rid), rows[b], tokens[b], path - b * n, int(predict[path[-1]]))
