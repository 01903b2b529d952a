"""Recorded rounds and cross-fitted predictions, aligned as (N rounds, topk) arrays for evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specrank import schema
from specrank.featurize.arrays import check_pool, manifest_value, round_arrays
from specrank.featurize.context import prompt_index
from specrank.featurize.rows import ROW_SOURCES
from specrank.featurize.storage import read_manifest, read_rounds_table, table_meta
from specrank.files import read_csv, read_table
from specrank.law import Law
from specrank.selection import PoolBatch
from specrank.folds import fold_of

COLUMNS = (
    ["prompt_id", "task", "round", "root_entropy"]
    + list(schema.POOL_COLUMNS)
    + [f"{s}_logp" for s in ROW_SOURCES]
)


@dataclass(eq=False)
class Rounds:
    """What offline evaluation reads from a run: the pools, the law and per-round labels.

    ``pool`` holds (N, M) arrays; ``rows`` maps each retained-row source to its (N, topk)
    log-probabilities (NaN absent); ``fold`` is the cross-fitting half (prompt index % 2).
    """

    pool: PoolBatch
    law: str
    prompt_id: np.ndarray  # (N,) str
    task: np.ndarray  # (N,) str
    round: np.ndarray  # (N,) int
    root_entropy: np.ndarray  # (N,) float
    rows: dict[str, np.ndarray]
    manifest: dict

    @property
    def n_rounds(self) -> int:
        return self.pool.n_rounds

    @property
    def topk(self) -> int:
        return self.pool.n_first

    @property
    def fold(self) -> np.ndarray:
        return fold_of(prompt_index(self.prompt_id))

    @property
    def first_label(self) -> np.ndarray:
        """(N, topk) target first factor under the law: p(x|c), or 1[x = argmax] under greedy."""
        return self.pool.first_draw_prob(self.law)

    @classmethod
    def from_table(cls, table, manifest: dict) -> "Rounds":
        """Rounds from an Arrow table / DataFrame with ``COLUMNS`` and the run's manifest."""
        topk = int(manifest_value(manifest, "topk"))
        a = round_arrays(table, COLUMNS)
        check_pool(a, topk)
        if a["round"].shape[0] == 0:
            raise schema.SchemaError("rounds: the run holds no rounds")
        pool = PoolBatch(**{k: a[k] for k in schema.POOL_COLUMNS}).validate()
        return cls(
            pool=pool,
            law=Law(float(manifest_value(manifest, "temperature"))).name,
            prompt_id=np.asarray(a["prompt_id"]).astype(str),
            task=np.asarray(a["task"]).astype(str),
            round=np.asarray(a["round"], dtype=np.int64),
            root_entropy=np.asarray(a["root_entropy"], dtype=np.float64),
            rows={s: np.asarray(a[f"{s}_logp"], dtype=np.float64) for s in ROW_SOURCES},
            manifest=manifest,
        )


def load_rounds(run_dir) -> Rounds:
    """The evaluation view of a run directory (manifest.json + rounds/*.parquet)."""
    return Rounds.from_table(read_rounds_table(run_dir, COLUMNS), read_manifest(run_dir))


def read_predictions(path) -> pd.DataFrame:
    """A cross-fitted predictions table (Parquet or CSV): keys + one column per reranker."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"predictions file {path} does not exist")
    if path.suffix == ".csv":
        frame = read_csv(path)
    else:
        table = read_table(path)
        frame = table.to_pandas()
        frame.attrs = table_meta(table, path)  # the rounds digest that ``specrank train`` recorded
    schema.require_columns(frame.columns, schema.FEATURE_KEYS, f"predictions ({path.name})")
    return frame


# ``specrank train`` also writes ``draft`` (= q1) and ``per_depth`` (its depth-1 map only); evaluation
# ranks draft from the recorded pool and re-fits the per-depth control over every depth.
NOT_RERANKERS = {schema.LABEL_COLUMN, schema.FOLD_COLUMN, "prompt_index", "token", "draft", "per_depth"}


def prediction_columns(predictions: pd.DataFrame) -> list[str]:
    """The reranker columns of a predictions table: numeric columns other than keys, label, fold, draft."""
    skip = set(schema.FEATURE_KEYS) | NOT_RERANKERS
    return [c for c in predictions.columns if c not in skip and pd.api.types.is_numeric_dtype(predictions[c])]


def align_predictions(rounds: Rounds, predictions: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each reranker column of ``predictions`` as an (N, topk) array in the rounds' order.

    Raises SchemaError when a round or candidate lacks a prediction, a key repeats, or a value is NaN.
    """
    schema.require_columns(predictions.columns, schema.FEATURE_KEYS, "predictions")
    names = prediction_columns(predictions)
    if not names:
        raise schema.SchemaError("predictions: no reranker columns besides the keys")
    n, k = rounds.n_rounds, rounds.topk
    keys = pd.MultiIndex.from_arrays([rounds.prompt_id, rounds.round])
    if keys.has_duplicates:
        raise schema.SchemaError("rounds: (prompt_id, round) repeats")
    row = keys.get_indexer(
        pd.MultiIndex.from_arrays([predictions["prompt_id"].astype(str).to_numpy(), predictions["round"].to_numpy()])
    )  # (P,) round index of each prediction row, -1 unknown
    cand = predictions["cand"].to_numpy(dtype=np.int64)
    bad = (row < 0) | (cand < 0) | (cand >= k)
    if bad.any():
        i = int(np.argmax(bad))
        raise schema.SchemaError(
            f"predictions: row {i} (prompt {predictions['prompt_id'].iloc[i]}, round {predictions['round'].iloc[i]},"
            f" cand {cand[i]}) matches no first-level candidate of the run"
        )
    slot = row * k + cand
    counts = np.bincount(slot, minlength=n * k)
    if (counts != 1).any():
        s = int(np.argmax(counts != 1))
        what = "repeats" if counts[s] > 1 else "is missing"
        raise schema.SchemaError(
            f"predictions: prompt {rounds.prompt_id[s // k]}, round {rounds.round[s // k]}, cand {s % k} {what}"
        )
    out = {}
    for name in names:
        flat = np.empty(n * k)
        flat[slot] = predictions[name].to_numpy(dtype=np.float64)
        if np.isnan(flat).any():
            raise schema.SchemaError(f"predictions: column {name} contains NaN")
        out[name] = flat.reshape(n, k)
    return out
