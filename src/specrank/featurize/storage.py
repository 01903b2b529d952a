"""Reading run directories and writing / reading features tables (Parquet, atomic writes)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from specrank import schema
from specrank.atomic import write_parquet_atomic
from specrank.featurize.arrays import label_kind
from specrank.featurize.edges import edge_frame
from specrank.featurize.features import META_KEY, features_meta, featurize_rounds, required_columns
from specrank.featurize.sets import CATEGORICAL_FEATURES, DESCRIPTIONS, PRIOR_FEATURE
from specrank.files import file_hash, read_json, read_schema, read_table
from specrank.law import Law


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


ROUNDS_DIGEST = "rounds_digest"  # the key, in a table's or a model's metadata, of the rounds it came from


def rounds_digest(run_dir) -> str:
    """sha256 over a run's ``manifest.json`` and ``rounds/*.parquet`` (names and bytes): the identity of the
    rounds that features, predictions and models are made from (other files in the run directory, such as
    its features, are not part of it)."""
    root = Path(run_dir)
    digest = hashlib.sha256()
    for path in [root / "manifest.json", *sorted(root.glob("rounds/*.parquet"))]:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        file_hash(path, digest)
    return digest.hexdigest()


def rounds_of(table) -> str | None:
    """The rounds digest recorded with a features, edges or predictions table (None when it records none)."""
    return (table.attrs.get(META_KEY) or {}).get(ROUNDS_DIGEST)


def check_same_rounds(what: str, recorded: str | None, expected: str | None, other: str) -> None:
    """Refuse ``what`` when it records other rounds than ``other`` does (a table that records none, as one
    written before digests were recorded, is not refused)."""
    if recorded and expected and recorded != expected:
        raise schema.SchemaError(f"{what}: made from rounds {recorded}, but {other} {expected}")


def _from_run(df: pd.DataFrame, run_dir) -> pd.DataFrame:
    df.attrs[META_KEY] = {**df.attrs[META_KEY], ROUNDS_DIGEST: rounds_digest(run_dir)}
    return df


def featurize_run(run_dir, *, labels: bool = True) -> pd.DataFrame:
    """``featurize_rounds`` over every shard of a run directory (manifest + rounds/*.parquet); the table's
    metadata records the run's rounds digest."""
    manifest = read_manifest(run_dir)
    files = sorted(Path(run_dir, "rounds").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no rounds/*.parquet in {run_dir}")
    columns = required_columns(read_schema(files[0]).names, label_kind(manifest), labels)
    return _from_run(featurize_rounds(read_rounds_table(run_dir, columns), manifest, labels=labels), run_dir)


def edges_run(run_dir, *, labels: bool = True) -> pd.DataFrame:
    """``edge_frame`` over every shard of a run directory (its rounds digest recorded too)."""
    manifest = read_manifest(run_dir)
    columns = ["prompt_id", "round", "parent", "depth", "q_edge"] + ([Law.of_label_kind(label_kind(manifest)).label_column] if labels else [])
    return _from_run(edge_frame(read_rounds_table(run_dir, columns), manifest, labels=labels), run_dir)




def write_features(df: pd.DataFrame, path) -> None:
    """Write a features table to Parquet atomically, its metadata in the file's key-value metadata."""
    meta = features_meta(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY.encode(): json.dumps(meta).encode()})
    write_parquet_atomic(table, path)


def table_meta(table: pa.Table, path) -> dict:
    """``{"specrank": metadata}`` of a table ``write_features`` wrote, else ``{}``."""
    raw = (table.schema.metadata or {}).get(META_KEY.encode())
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        meta = None
    if not isinstance(meta, dict):
        raise schema.SchemaError(f"{path}: damaged specrank metadata (not a JSON object)")
    return {META_KEY: meta}


def read_features(path) -> pd.DataFrame:
    """Read a features table written by ``write_features`` (metadata restored into ``attrs``)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no features file {path}")
    table = read_table(path)
    attrs = table_meta(table, path)
    if not attrs:
        raise schema.SchemaError(f"{path}: not a specrank features table (no specrank metadata)")
    df = table.to_pandas()
    df.attrs = attrs
    check_numeric(df, path)
    return df


def check_numeric(df: pd.DataFrame, path) -> None:
    """Refuse a features column that should hold numbers but holds text, naming the column and a value (a
    reranker would fail on it later without saying where)."""
    numeric = [c for c in DESCRIPTIONS if c not in CATEGORICAL_FEATURES and c != PRIOR_FEATURE]
    for col in [c for c in (*numeric, schema.LABEL_COLUMN) if c in df.columns]:
        if not pd.api.types.is_numeric_dtype(df[col]):
            values = pd.to_numeric(df[col], errors="coerce")
            bad = df[col][values.isna() & df[col].notna()]
            example = f", e.g. {bad.iloc[0]!r}" if len(bad) else ""
            raise schema.SchemaError(f"{path}: column {col!r} holds {df[col].dtype} values, not numbers{example}")
