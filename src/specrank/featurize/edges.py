"""``edge_frame``: one row per pool edge (depth, draft factor, label), for per-depth calibration."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specrank.featurize.arrays import check_pool, label_kind, manifest_value, round_arrays
from specrank.featurize.context import prompt_index
from specrank.featurize.features import META_KEY, feature_meta
from specrank.law import Law
from specrank.folds import fold_of

EDGE_KEYS = ["prompt_id", "round", "node"]  # node: pool index 0..M-1


def edge_frame(rounds, manifest: dict, *, labels: bool = True) -> pd.DataFrame:
    """N * M rows: ``EDGE_KEYS``, ``prompt_index``, ``fold``, ``depth``, ``q_edge`` and ``label``.

    The label is the edge's target probability (sampling runs) or argmax indicator (greedy runs);
    ``attrs["specrank"]`` is the features tables' metadata, so rerankers check it the same way.
    """
    kind = label_kind(manifest)
    topk = int(manifest_value(manifest, "topk"))
    cols = ["prompt_id", "round", "parent", "depth", "q_edge"] + ([Law.of_label_kind(kind).label_column] if labels else [])
    a = round_arrays(rounds, cols)
    check_pool(a, topk)
    n, m = a["depth"].shape
    pidx = prompt_index(a["prompt_id"])
    out = {
        "prompt_id": np.repeat(a["prompt_id"], m),
        "round": np.repeat(a["round"], m).astype(np.int64),
        "node": np.tile(np.arange(m, dtype=np.int64), n),
        "prompt_index": np.repeat(pidx, m).astype(np.int64),
        "fold": np.repeat(fold_of(pidx), m).astype(np.int64),
        "depth": a["depth"].reshape(-1).astype(np.int64),
        "q_edge": a["q_edge"].reshape(-1).astype(np.float64),
    }
    if labels:
        out["label"] = a[Law.of_label_kind(kind).label_column].reshape(-1).astype(np.float64)
    df = pd.DataFrame(out)
    df.attrs[META_KEY] = feature_meta(kind, topk, manifest_value(manifest, "temperature"))
    return df
