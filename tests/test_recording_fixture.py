"""Recording is unchanged by the decoding refactors: the rounds of a bundled prompt (SmolLM2-135M,
early-exit:8, the default 710-candidate pool, B = 59, M = 160, seed 3), greedy and at T = 1, equal bit for
bit the rounds recorded before them (the first of the two prompts in ``tests/fixtures/recorded/*.parquet``),
written by

    specrank decode --drafter early-exit:8 --limit 2 --max-new-tokens 10 --temperature T --seed 3 \\
        --shard-size 2 --threads 2 --out OUT        # at commit d6e12a4, before decode/ was reorganised

and recorded again here on one thread (beside another test worker, a second thread only waits for a core).

Re-pinned when retained rows began to be read through cached log-normalizers (``row[x] / T - logsumexp(row
/ T)`` instead of a full log-softmax): only the retained-row columns moved, by float32 rounding (at most
1.3e-5 absolute, 9e-6 relative in ``*_logp``; 4e-6 in the TV diagnostics); tokens, pools, labels and
acceptance are unchanged.

Compared across CPUs: float32 values to float32 noise, integers exactly, and each round's pool by its paths
(candidates whose draft probabilities tie to float32 noise are ordered differently by different CPUs; the
fixture was written on an AMD EPYC, and an Intel Xeon orders one such pair of expanded nodes the other way).
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrank.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "recorded"


@pytest.mark.slow
@pytest.mark.parametrize("temperature,name", [(0, "greedy"), (1, "t1")])
def test_recording_equals_the_rounds_recorded_before_the_refactor(tmp_path, temperature, name):
    out = tmp_path / name
    argv = ["decode", "--drafter", "early-exit:8", "--limit", "1", "--max-new-tokens", "10", "--temperature",
            str(temperature), "--seed", "3", "--shard-size", "2", "--threads", "1", "--no-progress", "--no-tracking",
            "--out", str(out)]
    assert main(argv) == 0
    (shard,) = (out / "rounds").glob("shard-*.parquet")
    got = pq.read_table(shard)
    want = first_prompt(pq.read_table(FIXTURES / f"{name}.parquet"))
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows > 0
    got_columns = in_fixture_order(got, want)
    for column in want.column_names:
        a, b = got_columns[column], want.column(column).to_pylist()
        if a == b:
            continue
        x, y = np.asarray(a, dtype=object).astype(float), np.asarray(b, dtype=object).astype(float)
        if pa.types.is_floating(_leaf(want.schema.field(column).type)):
            # float32 kernels differ in their last bits between CPUs (the fixture was written on another one):
            # probabilities agree to float32 accumulation noise, NaN positions exactly
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=column)
        else:  # tokens, parents, depths, counts: exactly (NaN != NaN in lists, so compared as arrays)
            np.testing.assert_array_equal(x, y, err_msg=column)


POOL = ("token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child")


def first_prompt(table: pa.Table) -> pa.Table:
    """The rounds of the fixture's first prompt: each prompt's rounds depend on it alone (its own seed, its own
    caches), so one prompt recorded again checks the recording as both did, in half the time."""
    ids = table.column("prompt_id").to_pylist()
    return table.slice(0, ids.count(ids[0]))


def paths(tokens, parents) -> list[tuple]:
    """Each candidate's tokens from the root (parents precede children in pool order)."""
    out = []
    for token, parent in zip(tokens, parents):
        out.append((out[parent] if parent >= 0 else ()) + (token,))
    return out


def in_fixture_order(got: pa.Table, want: pa.Table) -> dict[str, list]:
    """``got``'s columns as lists, each round's pool put in the fixture's candidate order where the two pools hold
    the same paths: siblings or expanded nodes whose draft probabilities tie to float32 noise come out in either
    order on different CPUs, which moves their pool indices, not the pool. A round whose paths differ stays as
    recorded (and fails the comparison)."""
    columns = {c: got.column(c).to_pylist() for c in got.column_names}
    want_tokens, want_parents = want.column("token").to_pylist(), want.column("parent").to_pylist()
    for r, (tokens, parents) in enumerate(zip(columns["token"], columns["parent"])):
        mine, theirs = paths(tokens, parents), paths(want_tokens[r], want_parents[r])
        if mine == theirs or sorted(mine) != sorted(theirs):
            continue
        where = {path: i for i, path in enumerate(mine)}
        order = [where[path] for path in theirs]  # fixture index -> recorded index
        moved = {old: new for new, old in enumerate(order)}
        for c in POOL:
            columns[c][r] = [columns[c][r][i] for i in order]
        columns["parent"][r] = [moved[p] if p >= 0 else p for p in columns["parent"][r]]
        columns["accepted_nodes"][r] = [moved[i] for i in columns["accepted_nodes"][r]]
    return columns


def _leaf(t):
    """The element type of a (nested) list type."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t
