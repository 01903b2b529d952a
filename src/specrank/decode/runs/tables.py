"""Round records -> Arrow tables with the exact columns and dtypes of ``specrank.schema``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa


from specrank import schema
from specrank.files import read_table

_ARROW = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "bool": pa.bool_(),
    "string": pa.string(),
}
_KEY_TYPES = {
    "prompt_id": "string",
    "task": "string",
    "round": "int32",
    "position": "int32",
    "prompt_len": "int32",
    "root_token": "int32",
}


def rounds_schema(pool_size: int, topk: int) -> pa.Schema:
    """The ``rounds`` table schema for pools of ``pool_size`` candidates and ``topk`` first-level ones."""
    fields = [pa.field(k, _ARROW[t]) for k, t in _KEY_TYPES.items()]
    fields += [pa.field(k, pa.list_(_ARROW[t], pool_size)) for k, t in schema.POOL_COLUMNS.items()]
    fields += [pa.field(k, _ARROW[t]) for k, t in schema.ROOT_COLUMNS.items()]
    for k, t in schema.OUTCOME_COLUMNS.items():
        fields.append(pa.field(k, pa.list_(pa.int16()) if t == "list<int16>" else _ARROW[t]))
    fields += [pa.field(k, pa.list_(_ARROW[t], topk)) for k, t in schema.ROW_COLUMNS.items()]
    fields += [pa.field(k, _ARROW[t]) for k, t in schema.ROW_SCALARS.items()]
    fields += [pa.field(k, _ARROW[t]) for k, t in schema.DIAGNOSTIC_COLUMNS.items()]
    assert [f.name for f in fields] == schema.ROUNDS_COLUMNS
    return pa.schema(fields)


def _column(values, field: pa.Field) -> pa.Array:
    """One column from a list of per-round values (scalars or arrays)."""
    t = field.type
    if pa.types.is_fixed_size_list(t):
        dtype = t.value_type.to_pandas_dtype()
        flat = np.stack([np.asarray(v, dtype=dtype) for v in values])  # (R, size)
        if flat.shape[1] != t.list_size:
            raise schema.SchemaError(f"rounds: column {field.name} has length {flat.shape[1]}, expected {t.list_size}")
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=t.value_type), t.list_size)
    if pa.types.is_list(t):
        return pa.array([np.asarray(v, dtype=np.int16) for v in values], type=t)
    if pa.types.is_string(t):
        return pa.array([str(v) for v in values], type=t)
    return pa.array(np.asarray(values, dtype=t.to_pandas_dtype()), type=t)


def rounds_table(records: list[dict], pool_size: int, topk: int) -> pa.Table:
    """Stack per-round dicts (one key per ``schema.ROUNDS_COLUMNS``) into a typed table."""
    sch = rounds_schema(pool_size, topk)
    if not records:
        return sch.empty_table()
    missing = [c for c in schema.ROUNDS_COLUMNS if c not in records[0]]
    if missing:
        raise schema.SchemaError(f"rounds: missing columns {', '.join(missing)}")
    cols = [_column([r[f.name] for r in records], f) for f in sch]
    return pa.Table.from_arrays(cols, schema=sch)




def read_shards(run_dir, folder: str):
    """Every ``run_dir/folder/*.parquet`` shard as one pandas DataFrame (shard order)."""
    files = sorted(Path(run_dir, folder).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no {folder}/*.parquet in {run_dir}")
    return pa.concat_tables([read_table(f) for f in files]).to_pandas()


def read_rounds(run_dir):
    """All recorded rounds of a run directory as one pandas DataFrame (shard order)."""
    return read_shards(run_dir, "rounds")
