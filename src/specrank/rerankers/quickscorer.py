"""A LightGBM booster's trees as QuickScorer arrays (Lucchese et al., "QuickScorer: a fast algorithm to rank
documents with additive ensembles of regression trees", SIGIR 2015), scored by one numba kernel
(``rerankers.quickscorer_kernel``).

Each tree's leaves, numbered left to right (at most 64), are bits of a word; an internal node whose test
fails (the row goes right) clears the bits of its left subtree, and the row's exit leaf is the lowest bit
left. The order in which nodes are applied does not matter, so the nodes are stored per feature by
threshold: a row visits, for each feature, only the nodes whose threshold lies below its value, as one
forward scan through a few hundred kilobytes. That is why it beats traversal and compiled branch code
inside a decoding loop, where the target's forwards have evicted the model from the caches: the scan is
what the hardware prefetcher streams, branch code and node jumps are not. The margins are summed in
LightGBM's tree order from the same float64 leaves and thresholds, so they equal ``Booster.predict(...,
raw_score=True)`` exactly (``tests/test_quickscorer.py``).

LightGBM's decisions (``include/LightGBM/tree.h``, ``NumericalDecision`` / ``CategoricalDecision``): a
numerical node sends a row left when ``value <= threshold``; a missing value goes the default way when the
node's missing type is NaN and is read as 0.0 when it is None; a categorical node sends a row left when its
category, the value truncated to an integer, is in the node's set (missing or negative: right).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrank.featurize import round_inputs

ALL_LEAVES = np.uint64(0xFFFFFFFFFFFFFFFF)
MAX_LEAVES = 64  # leaves of a tree are the bits of one word
MAX_CATEGORY = 64  # categorical sets are words too


class Unsupported(ValueError):
    """A booster that QuickScorer arrays cannot represent exactly (LightGBM predicts it)."""


@dataclass
class QuickScorerArrays:
    """A booster's nodes per feature by threshold, its categorical nodes and its leaves."""

    offsets: np.ndarray  # (F + 1,) int64: feature f's numerical nodes are [offsets[f], offsets[f + 1])
    thresholds: np.ndarray  # (N,) float64, ascending within a feature
    trees: np.ndarray  # (N,) int32 tree of each node
    clears: np.ndarray  # (N,) uint64: the tree's bits kept when the row goes right (its left subtree cleared)
    nan_offsets: np.ndarray  # (F + 1,) int64: nodes that send a missing value right, per feature
    nan_trees: np.ndarray  # (Nn,) int32
    nan_clears: np.ndarray  # (Nn,) uint64
    cat_features: np.ndarray  # (C,) int32 categorical nodes' features
    cat_trees: np.ndarray  # (C,) int32
    cat_sets: np.ndarray  # (C,) uint64: bit c set when category c goes left
    cat_clears: np.ndarray  # (C,) uint64
    leaf_offsets: np.ndarray  # (T,) int64: tree t's leaves are leaf_values[leaf_offsets[t]:], left to right
    leaf_values: np.ndarray  # (L,) float64

    @property
    def n_features(self) -> int:
        return len(self.offsets) - 1


def arrays_of(booster) -> QuickScorerArrays:
    """The QuickScorer arrays of a LightGBM booster with one tree per iteration; ``Unsupported`` otherwise."""
    model = booster.dump_model()
    if model.get("num_tree_per_iteration", 1) != 1:
        raise Unsupported("more than one tree per iteration (multiclass)")
    n_features = booster.num_feature()
    numerical = [[] for _ in range(n_features)]  # per feature: (threshold, tree, clear)
    nan_right = [[] for _ in range(n_features)]  # per feature: (tree, clear)
    categorical, values, leaf_offsets = [], [], []

    def leaf_bits(node: dict, tree: int) -> int:  # the node's leaves as bits of the tree's word
        if "leaf_value" in node:
            values.append(float(node["leaf_value"]))
            return 1 << (len(values) - 1 - leaf_offsets[tree])
        if "leaf_coeff" in node or node.get("missing_type") == "Zero":
            raise Unsupported("linear trees or zero-as-missing nodes")
        left = leaf_bits(node["left_child"], tree)
        right = leaf_bits(node["right_child"], tree)
        clear = ~left & 0xFFFFFFFFFFFFFFFF
        feature = int(node["split_feature"])
        if node["decision_type"] == "==":
            categories = [int(c) for c in str(node["threshold"]).split("||")]
            if max(categories) >= MAX_CATEGORY:
                raise Unsupported(f"a categorical split on category {max(categories)} (>= {MAX_CATEGORY})")
            categorical.append((feature, tree, sum(1 << c for c in set(categories)), clear))
        else:
            threshold = float(node["threshold"])
            numerical[feature].append((threshold, tree, clear))
            nan_left = bool(node["default_left"]) if node["missing_type"] == "NaN" else 0.0 <= threshold
            if not nan_left:
                nan_right[feature].append((tree, clear))
        return left | right

    for tree, info in enumerate(model["tree_info"]):
        leaf_offsets.append(len(values))
        leaf_bits(info["tree_structure"], tree)
        if len(values) - leaf_offsets[tree] > MAX_LEAVES:
            raise Unsupported(f"tree {tree} has more than {MAX_LEAVES} leaves")
    return _packed(numerical, nan_right, categorical, leaf_offsets, values)


def _packed(numerical, nan_right, categorical, leaf_offsets, values) -> QuickScorerArrays:
    """The per-feature node lists as flat arrays: numerical nodes by feature, then threshold."""
    for nodes in numerical:
        nodes.sort(key=lambda n: n[0])
    flat = [n for nodes in numerical for n in nodes]
    flat_nan = [n for nodes in nan_right for n in nodes]
    column = lambda rows, i, dtype: np.array([r[i] for r in rows], dtype)  # noqa: E731
    counts = lambda groups: np.cumsum([0] + [len(g) for g in groups]).astype(np.int64)  # noqa: E731
    return QuickScorerArrays(
        offsets=counts(numerical), thresholds=column(flat, 0, np.float64), trees=column(flat, 1, np.int32),
        clears=column(flat, 2, np.uint64), nan_offsets=counts(nan_right), nan_trees=column(flat_nan, 0, np.int32),
        nan_clears=column(flat_nan, 1, np.uint64), cat_features=column(categorical, 0, np.int32),
        cat_trees=column(categorical, 1, np.int32), cat_sets=column(categorical, 2, np.uint64),
        cat_clears=column(categorical, 3, np.uint64), leaf_offsets=np.array(leaf_offsets, np.int64),
        leaf_values=np.array(values, np.float64))


class QuickScorer:
    """``raw(m)``: (n, F) float64 rows -> (n,) LightGBM raw margins, through the numba kernel."""

    def __init__(self, booster):
        from specrank.rerankers.quickscorer_kernel import margins, round_kernel  # numba: imported when used

        self.arrays = arrays_of(booster)
        self.kernel, self.round_kernel = margins, round_kernel()
        a = self.arrays
        self.tail = (a.offsets, a.thresholds, a.trees, a.clears, a.nan_offsets, a.nan_trees, a.nan_clears,
                     a.cat_features, a.cat_trees, a.cat_sets, a.cat_clears, a.leaf_offsets, a.leaf_values)
        self.raw(np.zeros((1, a.n_features)))  # compile (or load the cached kernels) now, not mid-decode
        one = np.zeros(1, np.int64)
        pool = round_inputs(one, one - 1, one + 1, np.ones(1, np.float32), np.zeros(1, np.float32), 1, 0, 1.0, 0.0,
                            0.0)
        nothing_read = (NO_COLUMNS, NO_COLUMNS, -1, NO_COLUMNS, np.zeros(0), 0.0, -1)
        self.round_probabilities(pool, self.round_model(nothing_read), 0.0)

    def raw(self, m: np.ndarray) -> np.ndarray:
        m = np.ascontiguousarray(m, dtype=np.float64)
        if m.ndim != 2 or m.shape[1] != self.arrays.n_features:
            raise ValueError(f"rows of {m.shape[-1]} features, the trees read {self.arrays.n_features}")
        return self.kernel(m, *self.tail)

    def round_model(self, plan: tuple) -> np.ndarray:
        """The trees and a reranker's ``plan`` as one array of 8-byte words (``quickscorer_kernel.round_words``),
        the round kernel's single model argument. ``plan``: (positions, columns) int64 (matrix column <- feature
        column), the prior's position, the prior's tokens (int64, sorted), means and default, the task's position
        (-1: not read)."""
        from specrank.rerankers.quickscorer_kernel import round_words  # numba: imported when used

        return round_words(self.arrays, plan)

    def round_probabilities(self, inputs, model: np.ndarray, task_code: float) -> np.ndarray:
        """(topk,) logistic margins, clipped to [0, 1], of one round's features (``featurize.RoundInputs``),
        computed inside the kernel; ``model`` from ``round_model``. One call a round."""
        out = np.empty(inputs.topk)
        self.round_kernel(*inputs, task_code, model, out)
        return out


NO_COLUMNS = np.zeros(0, np.int64)


def quickscorer_of(booster) -> tuple[QuickScorer | None, str]:
    """(scorer, how) or (None, why not: LightGBM predicts)."""
    try:
        return QuickScorer(booster), "QuickScorer arrays (numba)"
    except (ImportError, Unsupported) as exc:
        return None, f"LightGBM predict (no QuickScorer arrays: {type(exc).__name__}: {exc})"
