import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from specrank import schema
from specrank.atomic import write_parquet_atomic
from specrank.decode.runs.tables import read_rounds, rounds_schema, rounds_table

M, K = 6, 2


def _record(r):
    pool = {
        "token": np.arange(M) + r, "parent": [-1, -1, 0, 0, 1, 2], "depth": [1, 1, 2, 2, 2, 3],
        "q_edge": np.full(M, 0.5), "draft_logp": -np.arange(M, dtype=float),
        "p_edge": [0.1, 0.2, np.nan, 0.3, 0.4, 0.5], "p_argmax_child": [1, 0, 0, 1, 0, 1],
    }
    rec = {"prompt_id": "p0", "task": "qa", "round": r, "position": 3 * r, "prompt_len": 9, "root_token": 7,
           "root_entropy": 1.5, "root_argmax": 3, "root_argmax_prob": 0.4,
           "accepted": 2, "accepted_nodes": [0, 2], "continuation": 11, "emitted_rank": -1, "covered": False,
           "n_scored": 5, "cache_logp": [np.nan, -1.0], "same_token_logp": [-2.0, -3.0], "preceding_logp": [-1.0, np.nan],
           "cache_age": 1, "prev_tree_root_token_count": 0, "matched_tv": np.nan, "matched_argmax_agree": np.nan,
           "token_tv": 0.3, "token_argmax_agree": 1.0}
    rec.update(pool)
    return rec


def test_table_has_exact_columns_and_dtypes(tmp_path):
    table = rounds_table([_record(0), _record(1)], M, K)
    assert table.column_names == schema.ROUNDS_COLUMNS
    for name, t in schema.POOL_COLUMNS.items():
        assert table.schema.field(name).type == pa.list_(getattr(pa, t)(), M)
    assert table.schema.field("accepted_nodes").type == pa.list_(pa.int16())
    assert table.schema.field("covered").type == pa.bool_()
    write_parquet_atomic(table, tmp_path / "rounds" / "shard-00000.parquet")
    assert [p.name for p in (tmp_path / "rounds").iterdir()] == ["shard-00000.parquet"]  # no temp file left
    df = read_rounds(tmp_path)
    assert isinstance(df, pd.DataFrame) and len(df) == 2
    np.testing.assert_array_equal(df["token"][1], np.arange(M) + 1)
    assert np.isnan(df["p_edge"][0][2]) and df["p_edge"][0].dtype == np.float32
    assert list(df["accepted_nodes"][0]) == [0, 2]


def test_wrong_length_and_missing_columns_raise():
    bad = _record(0)
    bad["token"] = np.arange(M + 1)
    with pytest.raises(schema.SchemaError, match="token has length 7"):
        rounds_table([bad], M, K)
    bad = _record(0)
    del bad["token_tv"]
    with pytest.raises(schema.SchemaError, match="missing columns token_tv"):
        rounds_table([bad], M, K)


def test_empty_table_and_failed_write_leave_nothing(tmp_path):
    assert rounds_table([], M, K).schema == rounds_schema(M, K)

    class Boom:
        schema = None
    with pytest.raises(Exception):
        write_parquet_atomic(Boom(), tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []
