"""Reading run directories and writing / reading features tables (Parquet, atomic writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from specrank import schema
from specrank.atomic import write_parquet_atomic
from specrank.files import read_json, read_schema, read_table
from specrank.featurize.arrays import label_kind
from specrank.featurize.edges import edge_frame
from specrank.featurize.features import LABEL_SOURCE, META_KEY, features_meta, featurize_rounds, required_columns


def read_manifest(run_dir) -> dict:
    """The run's manifest.json as a dict."""
    path = Path(run_dir, "manifest.json")
    if not path.is_file():
        raise FileNotFoundError(f"no manifest.json in {run_dir}")
    manifest = read_json(path, "run manifest")
    if not isinstance(manifest, dict):
        raise schema.SchemaError(f"{path}: not a run manifest (a JSON object)")
    return manifest


def read_rounds_table(run_dir, columns=None) -> pa.Table:
    """All shards of ``run_dir/rounds`` as one Arrow table (shard order), only ``columns``."""
    files = sorted(Path(run_dir, "rounds").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no rounds/*.parquet in {run_dir}")
    tables = []
    for f in files:
        names = read_schema(f).names
        schema.require_columns(names, columns or [], f"rounds ({f.name})")
        tables.append(read_table(f, columns=columns))
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid as exc:  # e.g. fixed-size lists of two lengths
        first = str(exc).splitlines()[0]
        raise schema.SchemaError(f"rounds: shards have different schemas (pool shapes mixed?): {first}") from None


def featurize_run(run_dir, *, labels: bool = True) -> pd.DataFrame:
    """``featurize_rounds`` over every shard of a run directory (manifest + rounds/*.parquet)."""
    manifest = read_manifest(run_dir)
    files = sorted(Path(run_dir, "rounds").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no rounds/*.parquet in {run_dir}")
    columns = required_columns(read_schema(files[0]).names, label_kind(manifest), labels)
    return featurize_rounds(read_rounds_table(run_dir, columns), manifest, labels=labels)


def edges_run(run_dir, *, labels: bool = True) -> pd.DataFrame:
    """``edge_frame`` over every shard of a run directory."""
    manifest = read_manifest(run_dir)
    columns = ["prompt_id", "round", "parent", "depth", "q_edge"] + ([LABEL_SOURCE[label_kind(manifest)]] if labels else [])
    return edge_frame(read_rounds_table(run_dir, columns), manifest, labels=labels)




def write_features(df: pd.DataFrame, path) -> None:
    """Write a features table to Parquet atomically, its metadata in the file's key-value metadata."""
    meta = features_meta(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY.encode(): json.dumps(meta).encode()})
    write_parquet_atomic(table, path)


def read_features(path) -> pd.DataFrame:
    """Read a features table written by ``write_features`` (metadata restored into ``attrs``)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no features file {path}")
    table = read_table(path)
    raw = (table.schema.metadata or {}).get(META_KEY.encode())
    if raw is None:
        raise schema.SchemaError(f"{path}: not a specrank features table (no specrank metadata)")
    df = table.to_pandas()
    df.attrs = {META_KEY: json.loads(raw)}
    return df
