"""``featurize_rounds``: one row per (round, first-level candidate) with every feature of docs/design.md."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pyarrow as pa

import specrank
from specrank import schema
from specrank.featurize.arrays import check_pool, label_kind, manifest_value, round_arrays
from specrank.featurize.block import RoundInputs, candidate_block, round_block
from specrank.featurize.columns import COLUMN, NUMERIC_CONTEXT
from specrank.featurize.context import previous_acceptance
from specrank.featurize.draft import DRAFT_FEATURES
from specrank.featurize.rows import ROW_FEATURES, ROW_SOURCES
from specrank.featurize.subtree import SUBTREE_FEATURES
from specrank.law import Law
from specrank.folds import fold_of

META_KEY = "specrank"
REQUIRED = (
    schema.ROUND_KEYS
    + ["token", "parent", "depth", "q_edge", "draft_logp"]
    + list(schema.ROW_COLUMNS)
    + list(schema.ROW_SCALARS)
)


def required_columns(rounds_columns, kind: str, labels: bool) -> list[str]:
    """Rounds columns the featurizer reads (``prev_accepted`` may stand in for ``accepted`` online)."""
    history = ["prev_accepted"] if "prev_accepted" in rounds_columns else ["accepted"]
    return REQUIRED + history + ([Law.of_label_kind(kind).label_column] if labels else [])


def _columns_of(rounds) -> list[str]:
    if isinstance(rounds, pa.Table):
        return rounds.column_names
    return list(rounds.keys()) if isinstance(rounds, dict) else list(rounds.columns)


def _slice(rounds, start: int, stop: int):
    """Rounds ``start:stop`` of a Table (zero-copy), dict of arrays or DataFrame."""
    if isinstance(rounds, pa.Table):
        return rounds.slice(start, stop - start)
    if isinstance(rounds, dict):
        return {k: v[start:stop] for k, v in rounds.items()}
    return rounds.iloc[start:stop]


FEATURE_GROUPS = ("draft", "subtree", "context", "rows")
# each group's numeric columns, as the features kernel writes them (the task is a key column)
GROUP_COLUMNS = dict(zip(FEATURE_GROUPS, (DRAFT_FEATURES, SUBTREE_FEATURES, NUMERIC_CONTEXT, ROW_FEATURES)))


def feature_groups(names) -> tuple[str, ...]:
    """The groups of ``FEATURE_GROUPS`` that compute ``names`` (the token prior needs only ``token``)."""
    return tuple(g for g in FEATURE_GROUPS if any(n in GROUP_COLUMNS[g] or (g, n) == ("context", "task") for n in names))


def candidate_features(a: dict, topk: int, kind: str, labels: bool,
                       groups=FEATURE_GROUPS) -> dict[str, np.ndarray]:
    """The per-candidate arrays of ``groups`` (all by default) of a chunk of rounds, each (n, topk), from one
    call of the features kernel (``featurize.block``)."""
    rows = "rows" in groups and f"{ROW_SOURCES[0]}_logp" in a
    row = lambda k: a[k] if rows else None  # noqa: E731
    block = candidate_block(a["token"], a["parent"], a["depth"], a["q_edge"], a["draft_logp"], topk, a["root_token"],
                            a["prompt_len"], a["position"], a["prev_accepted"], row("cache_logp"),
                            row("same_token_logp"), row("preceding_logp"), row("cache_age"),
                            row("prev_tree_root_token_count"), a.get("first_ancestor"))
    feats = {"token": a["token"][:, :topk].astype(np.int64)}
    feats.update({f: block[:, :, COLUMN[f]] for g in groups for f in GROUP_COLUMNS[g]})
    if labels:
        feats[schema.LABEL_COLUMN] = a[Law.of_label_kind(kind).label_column][:, :topk].astype(np.float64)
    return feats


def prompt_indices(prompt_id: np.ndarray, prompt_ids=None) -> np.ndarray:
    """Each round's prompt index: the rank of its prompt id among ``prompt_ids`` (by default the sorted distinct ids
    of ``prompt_id``), refusing an id ``prompt_ids`` lacks."""
    ids = np.unique(prompt_id) if prompt_ids is None else np.asarray(prompt_ids)
    pidx = np.searchsorted(ids, prompt_id)
    if np.any(pidx >= len(ids)) or np.any(ids[np.minimum(pidx, len(ids) - 1)] != prompt_id):
        raise schema.SchemaError("rounds: a prompt id is missing from prompt_ids")
    return pidx


def featurize_rounds(rounds, manifest: dict, *, labels: bool = True, prompt_ids=None,
                     chunk_rounds: int = 2048) -> pd.DataFrame:
    """Features of N rounds (Arrow table, DataFrame or dict of arrays) -> DataFrame of N * topk rows.

    Columns: ``schema.FEATURE_KEYS``, ``prompt_index`` (rank of the round's prompt id among
    ``prompt_ids``, by default the table's sorted distinct ids), ``fold`` (= prompt_index % 2),
    ``token``, every feature of ``specrank.featurize.sets`` except the token prior, and ``label``
    (``p_edge`` at the candidate for sampling runs, ``p_argmax_child`` for greedy runs) when
    ``labels``. ``attrs["specrank"]`` records the label kind, topk and temperature. Pools are
    processed ``chunk_rounds`` rounds at a time (vectorized within a chunk) to bound memory.
    """
    kind = label_kind(manifest)
    topk = int(manifest_value(manifest, "topk"))
    names = required_columns(_columns_of(rounds), kind, labels)
    history = names[len(REQUIRED)]  # accepted, or prev_accepted online
    head = round_arrays(rounds, schema.ROUND_KEYS + [history])
    n = len(head["round"])
    if n == 0:
        raise schema.SchemaError("rounds: no rounds to featurize")
    if history == "accepted":
        head["prev_accepted"] = previous_acceptance(head["prompt_id"], head["round"], head["accepted"])
    per_chunk = [c for c in names if c not in schema.ROUND_KEYS and c != history]
    out, width = {}, None
    for start in range(0, n, chunk_rounds):  # chunks of rounds, vectorized inside
        stop = min(start + chunk_rounds, n)
        a = round_arrays(_slice(rounds, start, stop), per_chunk)
        a.update({k: head[k][start:stop] for k in ("root_token", "prompt_len", "position", "prev_accepted")})
        check_pool(a, topk)
        if width is not None and a["parent"].shape[1] != width:
            raise schema.SchemaError(f"rounds: pools of {width} and {a['parent'].shape[1]} candidates (pool shapes mixed)")
        width = a["parent"].shape[1]
        for k, v in candidate_features(a, topk, kind, labels).items():
            out.setdefault(k, np.empty((n, topk), dtype=v.dtype))[start:stop] = v

    pidx = prompt_indices(head["prompt_id"], prompt_ids)
    rep = lambda v: np.repeat(np.asarray(v), topk)  # noqa: E731  (N,) -> (N * K,)
    tasks, task_codes = np.unique(np.asarray(head["task"]).astype(str), return_inverse=True)
    cols = {
        "prompt_id": rep(head["prompt_id"]),
        "task": pd.Categorical.from_codes(rep(task_codes.reshape(-1)), categories=tasks),
        "round": rep(head["round"]).astype(np.int64),
        "cand": np.tile(np.arange(topk, dtype=np.int64), n),
        "prompt_index": rep(pidx).astype(np.int64),
        "fold": rep(fold_of(pidx)).astype(np.int64),
    }
    cols.update({k: v.reshape(-1) for k, v in out.items()})
    df = pd.DataFrame(cols, copy=False)
    df.attrs[META_KEY] = feature_meta(kind, topk, manifest_value(manifest, "temperature"))
    return df


class FeatureArrays:
    """One round's first-level features, read like a features DataFrame (``[name]`` -> (topk,) array,
    ``columns``, ``in``, ``attrs``, ``len``) by every reranker, without pandas per round. The numeric columns
    are views of ``block``, the kernel's (topk, len(BLOCK_FEATURES)) array, computed on first use: a reranker
    may gather its whole matrix from it at once, one that reads only ``q`` (the drafter's probability, the
    pool's own entry) never runs the kernel, and a compiled one passes ``inputs`` to its own kernel, which
    computes the features and the predictions in one call."""

    def __init__(self, inputs: RoundInputs, task: str | None, columns: tuple, attrs: dict):
        self.inputs, self._block, self._q, self._token = inputs, None, None, None
        self.task, self.attrs, self._columns = task, attrs, columns

    @property
    def token(self) -> np.ndarray:
        """The first-level candidates' tokens (a view, made when first read: a compiled reranker never reads it)."""
        if self._token is None:
            self._token = self.inputs.token[: self.inputs.topk]
        return self._token

    @property
    def block(self) -> np.ndarray:
        if self._block is None:
            self._block = round_block(self.inputs)
        return self._block

    @property
    def q(self) -> np.ndarray:
        """The drafter's first-level probabilities as float64 (the kernel's ``q`` column)."""
        if self._q is None:
            self._q = self.inputs.q_edge[: self.inputs.topk].astype(np.float64)
        return self._q

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def __contains__(self, name) -> bool:
        return name in self._columns

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._columns:
            raise KeyError(name)
        if name == "token":
            return self.token
        if name == "q":  # the kernel's q column is this float64 copy of the pool's float32 entry
            return self.q
        if name == "task":
            return np.full(len(self.token), self.task, dtype=object)
        return self.block[:, COLUMN[name]]

    def __len__(self) -> int:
        return min(self.inputs.topk, len(self.inputs.token))


@functools.lru_cache(maxsize=None)
def round_columns(groups: tuple) -> tuple:
    """The columns of one round's features of ``groups``: ``token``, the groups' features, ``task`` with the context."""
    return ("token", *(f for g in groups for f in GROUP_COLUMNS[g]), *(("task",) if "context" in groups else ()))


@functools.lru_cache(maxsize=None)
def round_meta(kind: str, topk: int, temperature: float) -> dict:
    return {META_KEY: feature_meta(kind, topk, temperature)}


def round_features(inputs: RoundInputs, *, task: str, temperature: float, groups=FEATURE_GROUPS) -> FeatureArrays:
    """Features of one round's ``topk`` first-level candidates (``featurize.block.RoundInputs``), computed by the
    offline featurizer's own kernel (so they equal ``featurize_rounds`` on the recorded round, bit for bit), when
    first read. The columns of ``groups`` are returned (a reranker reads the columns it was fitted on)."""
    kind = Law(temperature).label_kind
    return FeatureArrays(inputs, task, round_columns(tuple(groups)), round_meta(kind, inputs.topk, float(temperature)))


def feature_meta(kind: str, topk: int, temperature) -> dict:
    return {"label_kind": kind, "topk": int(topk), "temperature": float(temperature), "version": specrank.__version__}


def features_meta(df: pd.DataFrame) -> dict:
    """The ``attrs["specrank"]`` record of a features table; ValueError when it is absent."""
    meta = df.attrs.get(META_KEY)
    if not meta:
        raise schema.SchemaError("features: no specrank metadata (label kind, topk); build them with specrank.featurize")
    return meta
