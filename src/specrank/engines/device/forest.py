"""A LightGBM booster's trees scored on a torch device, exactly as LightGBM scores them.

The trees are the QuickScorer arrays of ``rerankers.quickscorer`` (Lucchese et al., SIGIR 2015): a node whose test
sends a row right clears the leaves of its left subtree, and the row's exit leaf is the leftmost leaf left. On
the host that is a bit scan; here each tree is padded to ``P`` internal nodes and ``L`` leaves and the clearing is
one batched product, so a batch of rows costs a fixed, short list of tensor operations whatever the trees' depth,
with static shapes a CUDA graph can capture:

    right (n, T, P)      = the node's test fails (LightGBM's ``NumericalDecision`` / ``CategoricalDecision``)
    cleared (T, n, L)    = right @ left_of (T, P, L)          left_of[t, p, l]: leaf l is in node p's left subtree
    exit (T, n)          = the first leaf cleared by no node (argmin: the first minimum, 0)
    margin (n,)          = sum over trees of the exit leaves' values (float64)

Thresholds, leaf values and the comparisons are float64, as LightGBM's; the margins equal ``Booster.predict(...,
raw_score=True)`` up to the order of the sum over trees (``tests/test_device.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specrank.rerankers.quickscorer import MAX_CATEGORY, QuickScorerArrays, arrays_of


@dataclass
class DeviceForest:
    """A booster's trees as padded tensors on one device (``forest_of``); ``margins(x)`` scores rows there."""

    feature: torch.Tensor  # (T, P) int64 the node's feature (0 for padding)
    threshold: torch.Tensor  # (T, P) float64; padding +inf: never right
    nan_right: torch.Tensor  # (T, P) bool: a missing value goes right
    categorical: torch.Tensor  # (T, P) bool
    category_set: torch.Tensor  # (T, P) int64: bit c set when category c goes left
    left_of: torch.Tensor  # (T, P, L) float32: leaf l lies in node p's left subtree
    leaf_value: torch.Tensor  # (T, L) float64; padding 0 (never the exit: a tree's last leaf is never cleared)
    any_missing_right: bool = True  # some node sends a missing value right
    any_categorical: bool = True  # some node is categorical

    @property
    def device(self) -> torch.device:
        return self.threshold.device

    def to(self, device) -> DeviceForest:
        tensors = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return DeviceForest(**{f: t.to(device) if isinstance(t, torch.Tensor) else t for f, t in tensors.items()})

    def margins(self, x: torch.Tensor) -> torch.Tensor:
        """(n, F) float64 rows -> (n,) raw margins."""
        right = self.decisions(x)
        exit_leaf = torch.bmm(right.transpose(0, 1).float(), self.left_of).argmin(dim=-1)  # (T, n)
        return torch.gather(self.leaf_value, 1, exit_leaf).sum(dim=0)

    def decisions(self, x: torch.Tensor) -> torch.Tensor:
        """(n, F) float64 rows -> (n, T, P) bool: each node sends the row right."""
        v = x[:, self.feature]  # (n, T, P)
        right = v > self.threshold
        if self.any_missing_right:  # known when the forest was built: no device read
            right |= torch.isnan(v) & self.nan_right
        if self.any_categorical:
            code = torch.nan_to_num(v, nan=-1.0).trunc()
            inside = (code >= 0) & (code < MAX_CATEGORY)
            goes_left = inside & ((self.category_set >> code.clamp(0, MAX_CATEGORY - 1).long()) & 1).bool()
            right = torch.where(self.categorical, ~goes_left, right)
        return right

    def fold(self, feature: int, value: float) -> DeviceForest:
        """The same trees for rows whose ``feature`` always holds ``value`` (an engine's unknown task): each node
        testing it sends every row one way, decided here, so a step skips the test (and, when only that feature
        was categorical, every categorical test)."""
        on = (self.feature == feature).cpu().numpy()
        if not on.any():
            return self
        f = {name: getattr(self, name).cpu().numpy().copy() for name in ("threshold", "nan_right", "categorical",
                                                                          "category_set")}
        x = torch.full((1, int(self.feature.max()) + 1), value, dtype=torch.float64)
        goes_right = self.to("cpu").decisions(x)[0].numpy() & on  # (T, P)
        f["threshold"][on] = np.where(goes_right[on], -np.inf, np.inf)  # -inf: always right (NaN too, below)
        f["nan_right"][on] = goes_right[on]
        f["categorical"][on] = False
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields |= {name: torch.from_numpy(a).to(self.device) for name, a in f.items()}
        return DeviceForest(**{**fields, "any_missing_right": bool(f["nan_right"].any()),
                               "any_categorical": bool(f["categorical"].any())})


def _clear_bits(word: int, leaves: int) -> np.ndarray:
    """(leaves,) bool: the leaves a node's clear word removes (its bit is 0)."""
    return np.array([not (word >> leaf) & 1 for leaf in range(leaves)], dtype=bool)


def forest_of(booster, device="cpu") -> DeviceForest:
    """The booster's trees as a ``DeviceForest`` on ``device`` (``quickscorer.Unsupported`` where QuickScorer
    arrays cannot hold them)."""
    a: QuickScorerArrays = arrays_of(booster)
    trees = len(a.leaf_offsets)
    leaves = np.diff(np.append(a.leaf_offsets, len(a.leaf_values)))
    nodes: list[list] = [[] for _ in range(trees)]  # per tree: (feature, threshold, nan_right, cat, set, clear)
    nan_nodes = set()
    for f in range(a.n_features):
        for j in range(a.nan_offsets[f], a.nan_offsets[f + 1]):
            nan_nodes.add((f, int(a.nan_trees[j]), int(a.nan_clears[j])))
    for f in range(a.n_features):
        for j in range(a.offsets[f], a.offsets[f + 1]):
            t, clear = int(a.trees[j]), int(a.clears[j])
            nodes[t].append((f, float(a.thresholds[j]), (f, t, clear) in nan_nodes, False, 0, clear))
    for f, t, s, clear in zip(a.cat_features, a.cat_trees, a.cat_sets, a.cat_clears):
        nodes[int(t)].append((int(f), np.inf, False, True, int(s), int(clear)))
    p, n_leaves = max(1, max(len(n) for n in nodes)), int(leaves.max())
    feature, nan_right, categorical = np.zeros((trees, p), np.int64), np.zeros((trees, p), bool), np.zeros((trees, p), bool)
    threshold, category_set = np.full((trees, p), np.inf), np.zeros((trees, p), np.int64)
    left_of, leaf_value = np.zeros((trees, p, n_leaves), np.float32), np.zeros((trees, n_leaves))
    for t, tree_nodes in enumerate(nodes):
        leaf_value[t, : leaves[t]] = a.leaf_values[a.leaf_offsets[t]: a.leaf_offsets[t] + leaves[t]]
        for i, (f, thr, nan, cat, bits, clear) in enumerate(tree_nodes):
            feature[t, i], threshold[t, i], nan_right[t, i], categorical[t, i] = f, thr, nan, cat
            category_set[t, i] = np.int64(np.uint64(bits).view(np.int64))
            left_of[t, i, : leaves[t]] = _clear_bits(clear, int(leaves[t]))
    arrays = (feature, threshold, nan_right, categorical, category_set, left_of, leaf_value)
    return DeviceForest(*(torch.from_numpy(x).to(device) for x in arrays), bool(nan_right.any()),
                        bool(categorical.any()))
