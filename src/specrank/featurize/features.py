"""``featurize_rounds``: one row per (round, first-level candidate) with every SPEC §5 feature."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pyarrow as pa

import specrank
from specrank import schema
from specrank.featurize.arrays import check_pool, label_kind, manifest_value, round_arrays
from specrank.featurize.context import context_features, previous_acceptance, prompt_index
from specrank.featurize.draft import draft_features
from specrank.featurize.rows import ROW_SOURCES, row_features
from specrank.featurize.subtree import subtree_features

META_KEY = "specrank"
LABEL_SOURCE = {"probability": "p_edge", "argmax": "p_argmax_child"}
REQUIRED = (
    schema.ROUND_KEYS
    + ["token", "parent", "depth", "q_edge", "draft_logp"]
    + list(schema.ROW_COLUMNS)
    + list(schema.ROW_SCALARS)
)


def required_columns(rounds_columns, kind: str, labels: bool) -> list[str]:
    """Rounds columns the featurizer reads (``prev_accepted`` may stand in for ``accepted`` online)."""
    history = ["prev_accepted"] if "prev_accepted" in rounds_columns else ["accepted"]
    return REQUIRED + history + ([LABEL_SOURCE[kind]] if labels else [])


def _columns_of(rounds) -> list[str]:
    if isinstance(rounds, pa.Table):
        return rounds.column_names
    return list(rounds.keys()) if isinstance(rounds, dict) else list(rounds.columns)


def featurize_rounds(rounds, manifest: dict, *, labels: bool = True) -> pd.DataFrame:
    """Features of N rounds (Arrow table, DataFrame or dict of arrays) -> DataFrame of N * topk rows.

    Columns: ``schema.FEATURE_KEYS``, ``prompt_index`` (rank of the prompt id among the table's
    sorted distinct ids), ``fold`` (= prompt_index % 2), ``token``, every feature of
    ``specrank.featurize.sets`` except the token prior, and ``label`` (``p_edge`` at the candidate
    for sampling runs, ``p_argmax_child`` for greedy runs) when ``labels``. ``attrs["specrank"]``
    records the label kind, topk and temperature.
    """
    kind = label_kind(manifest)
    topk = int(manifest_value(manifest, "topk"))
    a = round_arrays(rounds, required_columns(_columns_of(rounds), kind, labels))
    check_pool(a, topk)
    n = len(a["round"])
    token1 = a["token"][:, :topk]  # (N, K)
    prev = a["prev_accepted"] if "prev_accepted" in a else previous_acceptance(a["prompt_id"], a["round"], a["accepted"])
    feats = draft_features(a["q_edge"][:, :topk])
    feats.update(subtree_features(a["parent"], a["depth"], a["q_edge"], a["draft_logp"], topk))
    feats.update(context_features(token1, a["root_token"], a["prompt_len"], a["position"], prev))
    logp = {s: a[f"{s}_logp"] for s in ROW_SOURCES}
    feats.update(row_features(logp, a["cache_age"], a["prev_tree_root_token_count"]))

    pidx = prompt_index(a["prompt_id"])
    rep = lambda v: np.repeat(np.asarray(v), topk)  # noqa: E731  (N,) -> (N * K,)
    tasks, task_codes = np.unique(np.asarray(a["task"]).astype(str), return_inverse=True)
    cols = {
        "prompt_id": rep(a["prompt_id"]),
        "task": pd.Categorical.from_codes(rep(task_codes.reshape(-1)), categories=tasks),
        "round": rep(a["round"]).astype(np.int64),
        "cand": np.tile(np.arange(topk, dtype=np.int64), n),
        "prompt_index": rep(pidx).astype(np.int64),
        "fold": rep(pidx % 2).astype(np.int64),
        "token": token1.reshape(-1).astype(np.int64),
    }
    cols.update({k: np.ascontiguousarray(v).reshape(-1) for k, v in feats.items()})
    if labels:
        cols[schema.LABEL_COLUMN] = a[LABEL_SOURCE[kind]][:, :topk].reshape(-1).astype(np.float64)
    df = pd.DataFrame(cols)
    df.attrs[META_KEY] = feature_meta(kind, topk, manifest_value(manifest, "temperature"))
    return df


def feature_meta(kind: str, topk: int, temperature) -> dict:
    return {"label_kind": kind, "topk": int(topk), "temperature": float(temperature), "version": specrank.__version__}


def features_meta(df: pd.DataFrame) -> dict:
    """The ``attrs["specrank"]`` record of a features table; ValueError when it is absent."""
    meta = df.attrs.get(META_KEY)
    if not meta:
        raise schema.SchemaError("features: no specrank metadata (label kind, topk); build them with specrank.featurize")
    return meta
