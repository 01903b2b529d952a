"""Recorded rounds -> numpy arrays of N rounds (pool columns (N, M), row columns (N, topk)).

Accepts a pyarrow Table, a pandas DataFrame (list cells) or a dict of arrays, so the
offline featurizer and the online decoder (one round) share one code path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from specrank import schema
from specrank.law import Law
from specrank.schema import SchemaError


def manifest_value(manifest: dict, key: str):
    """``manifest[key]``, also looked up under a nested ``pool`` section; one-line error if absent."""
    for section in (manifest, manifest.get("pool") or {}, manifest.get("pool_shape") or {}):
        if key in section:
            return section[key]
    raise SchemaError(f"manifest: missing {key!r}")


def label_kind(manifest: dict) -> str:
    """``argmax`` for greedy runs (temperature 0), ``probability`` for sampling runs."""
    return Law(float(manifest_value(manifest, "temperature"))).label_kind


def _list_to_matrix(col: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        raise SchemaError(f"rounds: column {name} has null lists")
    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
    else:
        lengths = np.diff(arr.offsets.to_numpy())
        if n and lengths.min() != lengths.max():
            raise SchemaError(
                f"rounds: column {name} has lists of lengths {lengths.min()} and {lengths.max()}"
                " (rounds of different pool shapes mixed)"
            )
        width = int(lengths[0]) if n else 0
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(n, width)


def _to_numpy(value, name: str) -> np.ndarray:
    if isinstance(value, (pa.ChunkedArray, pa.Array)):
        if pa.types.is_list(value.type) or pa.types.is_large_list(value.type) or pa.types.is_fixed_size_list(value.type):
            return _list_to_matrix(value, name)
        return value.to_numpy(zero_copy_only=False)
    arr = np.asarray(value)
    if arr.dtype == object and arr.ndim == 1 and len(arr) and np.ndim(arr[0]) == 1:
        lengths = {len(v) for v in arr}
        if len(lengths) > 1:
            raise SchemaError(f"rounds: column {name} has lists of lengths {min(lengths)} and {max(lengths)}"
                              " (rounds of different pool shapes mixed)")
        arr = np.stack(arr)
    return arr


def round_arrays(rounds, columns) -> dict[str, np.ndarray]:
    """Columns of ``rounds`` (Table, DataFrame or dict) as numpy arrays; SchemaError names missing ones."""
    if isinstance(rounds, pa.Table):
        names = rounds.column_names
        get = rounds.column
    elif isinstance(rounds, dict):
        names = list(rounds)
        get = rounds.__getitem__
    else:  # pandas DataFrame
        names = list(rounds.columns)
        get = lambda c: rounds[c].to_numpy()  # noqa: E731
    schema.require_columns(names, columns, "rounds")
    out = {c: _to_numpy(get(c), c) for c in columns}
    n = {len(v) for v in out.values()}
    if len(n) > 1:
        raise SchemaError(f"rounds: columns have different numbers of rounds {sorted(n)}")
    return out


def check_pool(a: dict[str, np.ndarray], topk: int) -> None:
    """Pool columns share one (N, M) shape, the first ``topk`` entries are the first level, rows are (N, topk)."""
    shapes = {c: a[c].shape for c in schema.POOL_COLUMNS if c in a}
    if len(set(shapes.values())) > 1:
        raise SchemaError(f"rounds: pool columns have different shapes {shapes} (pool shapes mixed)")
    n, m = a["parent"].shape
    if m < topk:
        raise SchemaError(f"rounds: pool of {m} candidates is smaller than topk={topk}")
    first = a["depth"][:, :topk]
    if n and (np.any(first != 1) or np.any(a["parent"][:, :topk] != -1) or np.any(a["depth"][:, topk:] == 1)):
        raise SchemaError(f"rounds: the first-level candidates are not pool indices 0..{topk - 1} (topk mismatch?)")
    parent, idx = a["parent"], np.arange(m)
    if np.any((a["depth"] > 1) & ((parent < 0) | (parent >= idx))):
        raise SchemaError("rounds: a pool node's parent does not precede it (pool order broken)")
    for c in schema.ROW_COLUMNS:
        if c in a and a[c].shape != (n, topk):
            raise SchemaError(f"rounds: column {c} has shape {a[c].shape}, expected ({n}, {topk})")
