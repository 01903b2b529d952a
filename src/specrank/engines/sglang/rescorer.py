"""The plugin's work without SGLang: rescore a batch's draft tree (``layout.DraftTree``) with a specrank reranker,
and keep each request's retained target rows from its verify passes, as specrank's decoder keeps them
(``decode.engine.caches.RowCaches``: by token, the same-token row, the preceding row; on the CPU as
``rows.RetainedRows``, the same reads without full-vocabulary temporaries). A request whose ``Req`` SGLang has let
go is dropped when the next request arrives, and its rows' memory serves that request: first writes to new memory
cost the host more than the copies themselves.

Features are computed by the offline featurizer's own kernel (``featurize.round_features``) from the draft scores
SGLang hands over and the request's caches, so they equal ``featurize_rounds`` on the same tree
(``tests/test_engine_sglang.py``), except for what an engine cannot know (``featurize.engine``): its prefill keeps
no prompt rows, and the request's task is unknown unless named.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from specrank.decode.engine import RowCaches, TokenRows
from specrank.decode.strategies import RerankedSelection
from specrank.engines.sglang.layout import DraftTree
from specrank.engines.sglang.rows import BlockPool, RetainedRows, Scratch
from specrank.engines.sglang.score import plugin_score
from specrank.featurize import RoundInputs, round_features
from specrank.featurize.absent import NO_ANCESTOR, NO_ROWS
from specrank.featurize.engine import UNKNOWN_TASK
from specrank.law import Law
from specrank.selection.pool import PoolBatch

ROW_BLOCK = 16  # token rows allocated at a time per request (specrank's decoder takes 256; a server holds many)
TIE_STEP = 1e-9  # log-score subtracted per depth: torch.topk breaks ties in no stated order, and a child tied
# with its parent must rank below it, or SGLang would verify a node without its parent


class PluginError(ValueError):
    """A draft tree the loaded reranker cannot score; the message names the setting."""


@dataclass(frozen=True)
class DraftRequest:
    """What the plugin reads of one request at a draft step (SGLang's ``Req`` and ``EagleDraftInput``)."""

    rid: str
    root_token: int  # the last emitted token, the tree's root
    prompt_len: int
    position: int  # tokens emitted before this step
    owner: object = field(default=None, compare=False, repr=False)  # SGLang's Req, held weakly by the request's state


@dataclass
class RequestState:
    """One request's retained rows (none before its first verify pass) and history between verify passes."""

    caches: RowCaches | None = None
    owner: weakref.ref | None = None  # SGLang's Req: once collected, the request is gone (not merely paused)
    rounds: int = 0
    prev_accepted: float = float("nan")
    ranked: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # verified slots 1..n-1, best first


class TreeRescorer:
    """A reranker's rescoring of SGLang's draft trees, one state per request (the ``capacity`` most recent)."""

    def __init__(self, reranker, source: str = "", temperature: float = 0.0, task: str = UNKNOWN_TASK,
                 capacity: int = 64):
        self.strategy = RerankedSelection(reranker, source)
        self.law, self.temperature, self.task = Law(temperature), float(temperature), task
        if reranker.label_kind_ != self.law.label_kind:
            raise PluginError(f"reranker {source}: trained on {reranker.label_kind_} labels, the plugin runs at"
                              f" temperature {temperature:g} ({self.law.label_kind})")
        self.topk, self.deeper = int(reranker.topk_), self.strategy.deeper
        self.capacity, self.states = capacity, OrderedDict()
        self.scratch: Scratch | None = None  # where CPU rows are normalized, made with the first caches
        self.pool = BlockPool()  # the token-row blocks of requests gone, for the next ones
        self.strategy.prepare()

    def check(self, tree: DraftTree) -> None:
        if tree.topk != self.topk:
            raise PluginError(f"--speculative-eagle-topk {tree.topk}: the reranker {self.strategy.source} was"
                              f" trained on pools of topk {self.topk}; serve with --speculative-eagle-topk {self.topk}")

    def state(self, rid: str, owner=None) -> RequestState:
        """The request's state, made on first use (``owner``: SGLang's ``Req``), most recent last. A new request
        first releases the states of requests SGLang no longer holds; the oldest beyond ``capacity`` is dropped (a
        finished request is never seen again)."""
        st = self.states.get(rid)
        if st is None:
            self.release_gone()
            st = self.states[rid] = RequestState(owner=weak(owner))
            while len(self.states) > self.capacity:
                self.drop(next(iter(self.states)))
        self.states.move_to_end(rid)
        return st

    def drop(self, rid: str) -> None:
        """Forget a request; its token rows' blocks go to the pool."""
        st = self.states.pop(rid)
        if isinstance(st.caches, RetainedRows):
            st.caches.release()

    def release_gone(self) -> None:
        """Drop the states whose ``Req`` SGLang has let go: a finished request (a paused one SGLang still holds)."""
        for rid in [rid for rid, st in self.states.items() if st.owner is not None and st.owner() is None]:
            self.drop(rid)

    def new_caches(self, rows: torch.Tensor) -> RowCaches:
        """A request's caches for verify rows like ``rows`` (n, V); greedy runs keep rows at T = 1, as recorded. CPU
        rows: ``rows.RetainedRows`` (no full-vocabulary temporaries); a GPU's: ``RowCaches``, whose read block is
        copied to the host while the next round drafts."""
        vocab, temperature = int(rows.shape[-1]), self.temperature or 1.0
        if rows.device.type != "cpu":
            caches = RowCaches(vocab, temperature)
            caches.token_rows = TokenRows(vocab, ROW_BLOCK)
            return caches
        if self.scratch is None or self.scratch.block.shape[-1] != vocab:
            self.scratch = Scratch(vocab)
        return RetainedRows(vocab, temperature, self.scratch, self.pool, ROW_BLOCK)

    def inputs(self, tree: DraftTree, b: int, req: DraftRequest, rows: bool = True) -> RoundInputs:
        """The features kernel's inputs of request ``b``'s tree (``featurize.RoundInputs``), its retained rows read
        from its caches when ``rows`` and the request has a state."""
        st = self.state(req.rid, req.owner)
        block, index, has_rows, age, count = NO_ROWS, NO_ANCESTOR, False, -1, -1
        token = np.ascontiguousarray(tree.token[b])
        if rows and st.caches is not None:
            block, index, age, count = st.caches.gather(st.rounds, req.root_token, token[: self.topk])
            has_rows = True
        elif rows:  # a request's first step: no verify pass yet, every row absent
            block, index, has_rows = np.full((3, self.topk), np.nan, np.float32), np.arange(self.topk), True
        return RoundInputs(token, np.ascontiguousarray(tree.parent[b]), tree.depth, tree.q_edge[b],
                           tree.draft_logp[b], self.topk, int(req.root_token),
                           float(req.prompt_len), float(req.position), st.prev_accepted, block, index, has_rows,
                           float(age), float(count), NO_ANCESTOR)

    def features(self, tree: DraftTree, b: int, req: DraftRequest):
        """Request ``b``'s first-level features, every group (``featurize.FeatureArrays``)."""
        return round_features(self.inputs(tree, b, req), task=self.task, temperature=self.temperature)

    def first_factor(self, tree: DraftTree, b: int, req: DraftRequest) -> np.ndarray:
        """(topk,) r(x1) of request ``b``'s first-level candidates, as ``RerankedSelection.first_factor`` predicts."""
        s = self.strategy
        inputs = self.inputs(tree, b, req, s.needs_rows)
        if s.round_predictor is not None:
            return s.round_predictor(inputs, self.task)
        features = round_features(inputs, task=self.task, temperature=self.temperature, groups=s.groups)
        return s.compiled.predict_first_factor(features)

    def score(self, tree: DraftTree, requests: list[DraftRequest]) -> np.ndarray:
        """(b, C) float64 log-scores SGLang ranks instead of its draft products (``score.plugin_score``), each
        request's first factors from its own features; lower by ``TIE_STEP`` per depth (ties: shallower first)."""
        self.check(tree)
        first = np.stack([self.first_factor(tree, b, r) for b, r in enumerate(requests)])
        deeper = self.strategy.compiled.predict_deeper_factors if self.deeper else None
        score = plugin_score(pool_batch(tree), self.law.name, first, deeper)
        return score - TIE_STEP * tree.depth[None, :]

    def remember(self, requests: list[DraftRequest], selected: np.ndarray, score: np.ndarray) -> None:
        """After SGLang chose each request's tree: ``selected`` (b, n - 1) its flattened candidate indices in
        ascending order (the draft tokens' order after the root), ``score`` (b, C) what it ranked. Each request's
        verified nodes are kept best first (their slots 1..n-1 in the verify pass), as the caches store them."""
        for b, req in enumerate(requests):
            chosen = score[b, selected[b]]
            self.state(req.rid).ranked = 1 + np.lexsort((np.arange(len(chosen)), -chosen))  # ties: by position

    def retain(self, rid: str, rows: torch.Tensor, tokens: np.ndarray, accepted: np.ndarray, continuation: int) -> None:
        """After request ``rid``'s verify pass: ``rows`` (n, V) its target logits, slot 0 the root's, slots 1..n-1
        the draft tokens ``tokens`` (n,) in SGLang's order; ``accepted`` the accepted path's slots, the root first;
        ``continuation`` the token emitted after it (the next root). Stored as specrank's decoder stores a round
        (``decode.engine.round.retain``): the root row, the verified prefixes' rows best first, the last accepted
        node's row. A tree the plugin did not rescore (another algorithm's) is not kept."""
        st = self.state(rid)
        if not len(st.ranked):
            return
        if st.caches is None:
            st.caches = self.new_caches(rows)
        ranked, st.ranked = st.ranked, np.zeros(0, np.int64)
        st.caches.update(st.rounds, int(tokens[0]), rows, 0, tokens[ranked], ranked, int(accepted[-1]),
                         int(continuation), -1)
        st.rounds, st.prev_accepted = st.rounds + 1, float(len(accepted) - 1)


def weak(owner) -> weakref.ref | None:
    """A weak reference to ``owner`` (None: none, or an object that takes none)."""
    try:
        return None if owner is None else weakref.ref(owner)
    except TypeError:
        return None


def pool_batch(tree: DraftTree) -> PoolBatch:
    """The batch's trees as a ``PoolBatch`` (b, C) for the selection scores (no target probabilities: unread)."""
    b, c = tree.token.shape
    return PoolBatch(token=tree.token, parent=tree.parent, depth=np.broadcast_to(tree.depth, (b, c)),
                     q_edge=tree.q_edge, draft_logp=tree.draft_logp.astype(np.float32),
                     p_edge=np.full((b, c), np.nan, np.float32), p_argmax_child=np.zeros((b, c), np.int8))
