"""Engine tree settings: the trees a serving engine verifies, named in the engines' own terms (docs/tree-config.md).

SGLang's EAGLE tree (``--speculative-eagle-topk`` k, ``--speculative-num-steps`` s,
``--speculative-num-draft-tokens`` n) is a beam pool: the root row gives k candidates, each of the
s - 1 further steps expands the k best candidates of the previous level by cumulative draft
probability and adds their k best children; the verified tree is the n - 1 candidates of highest
cumulative draft probability, beside the root. EAGLE's ``top_k``, ``depth``, ``total_token`` name the
same tree with depth = s - 1 and total_token = n; a vLLM chain of ``num_speculative_tokens`` t is
k = 1, s = t, n = t + 1 (``TreeSetting``).

vLLM's static tree (``speculative_token_tree``, ``selection.static_tree``) verifies the same shape every round:
the top c_1 first tokens, then the top c_l children of every node above (``StaticTreeSetting``). Each engine's
room builds its settings from its own flags: ``engines.sglang.beam``, ``engines.vllm.token_trees``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from specrank.selection.static_tree import StaticTree

MAX_RECORDED_POOL = 1024  # candidates of one recorded pool: every one is in the target's pass


class TreeConfigError(ValueError):
    """A tree setting is impossible or lies outside the recorded pool; the message names the input."""


@dataclass(frozen=True, order=True)
class TreeSetting:
    """One engine tree, in SGLang's terms: topk k, num_steps s (tree depth), num_draft_tokens n (root included)."""

    topk: int
    num_steps: int
    num_draft_tokens: int

    def __post_init__(self):
        for name in ("topk", "num_steps", "num_draft_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TreeConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.num_draft_tokens < 2:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens}: the root and at least one draft token")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens} with topk 1: a chain of num_steps"
                                  f" {self.num_steps} verifies num_steps + 1 = {self.num_steps + 1} tokens"
                                  " (SGLang resets it to that)")
        if self.budget > self.candidates:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens}: topk {self.topk} and num_steps"
                                  f" {self.num_steps} draft only {self.candidates} candidates (at most"
                                  f" {self.candidates + 1} tokens with the root)")

    @property
    def budget(self) -> int:
        """Draft tokens verified beside the root (specrank's budget B)."""
        return self.num_draft_tokens - 1

    @property
    def candidates(self) -> int:
        """Candidates the beam drafts: k at depth 1, k * k at each later depth."""
        return self.topk + (self.num_steps - 1) * self.topk ** 2

    @property
    def label(self) -> str:
        return f"k{self.topk}-s{self.num_steps}-n{self.num_draft_tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def draft_shape(self) -> tuple[int, int, int]:
        """(topk, depth, expand) of the pool the drafter grows for this setting (the cost model times it)."""
        return self.topk, self.num_steps, self.topk

    def sglang_flags(self, head: str = "HEAD") -> str:
        return (f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {head} --speculative-num-steps "
                f"{self.num_steps} --speculative-eagle-topk {self.topk} --speculative-num-draft-tokens "
                f"{self.num_draft_tokens}")

    def eagle_arguments(self) -> str:
        return f"top_k={self.topk}, depth={self.num_steps - 1}, total_token={self.num_draft_tokens}"

    def vllm_config(self, head: str = "HEAD") -> str | None:
        """vLLM's ``--speculative-config`` JSON for a chain; None for a dynamic tree (vLLM has none)."""
        if not self.is_chain:
            return None
        return json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": self.num_steps})


@dataclass(frozen=True, order=True)
class StaticTreeSetting:
    """vLLM's static tree: ``num_speculative_tokens`` = the tree's size, every node verified each round."""

    tree: StaticTree

    def __post_init__(self):
        topk, depth = self.recording_topk, self.tree.depth
        size = sum(topk ** d for d in range(1, depth + 1))
        if size > MAX_RECORDED_POOL:
            raise TreeConfigError(f"static tree {self.label}: scoring it exactly needs a pool that expands every"
                                  f" node (topk {topk}, depth {depth}: {size} candidates, more than"
                                  f" {MAX_RECORDED_POOL})")

    @property
    def recording_topk(self) -> int:
        """The recorded pool's children per node: one more than the widest branching, so that root selection
        and a reranker have a first token beyond the drafter's top c_1 to choose."""
        return max(self.tree.branching) + 1

    @property
    def topk(self) -> int:
        return self.tree.branching[0]

    @property
    def num_steps(self) -> int:
        return self.tree.depth

    @property
    def num_draft_tokens(self) -> int:
        return self.tree.size + 1

    @property
    def budget(self) -> int:
        return self.tree.size

    @property
    def label(self) -> str:
        return self.tree.label

    @property
    def is_chain(self) -> bool:
        return False

    @property
    def draft_shape(self) -> tuple[int, int, int]:
        """vLLM drafts each level from all nodes of the level above: the pool of the widest branching that
        expands the widest level."""
        return max(self.tree.branching), self.tree.depth, max(self.tree.widths[:-1], default=1)

    def sglang_flags(self, head: str = "HEAD") -> None:
        return None  # SGLang has no static tree

    def eagle_arguments(self) -> None:
        return None

    def vllm_config(self, head: str = "HEAD") -> str:
        return json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": self.tree.size,
                           "speculative_token_tree": str(self.tree.choices)})


def setting_order(setting) -> tuple:
    """Sort key over both kinds of setting: the beams first, then the static trees."""
    return (isinstance(setting, StaticTreeSetting), setting.topk, setting.num_steps, setting.num_draft_tokens,
            setting.label)


def row_setting(row) -> TreeSetting | StaticTreeSetting:
    """The setting of a table row."""
    if row.get("tree", ""):
        return StaticTreeSetting(StaticTree.from_choices(row["tree"]))
    return TreeSetting(int(row["topk"]), int(row["num_steps"]), int(row["num_draft_tokens"]))
