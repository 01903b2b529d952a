"""Recording is unchanged by the decoding refactors: the rounds of 2 bundled prompts (SmolLM2-135M,
early-exit:8, the default 710-candidate pool, B = 59, M = 160, seed 3), greedy and at T = 1, equal bit for
bit the rounds recorded before them (``tests/fixtures/recorded/*.parquet``), written by

    specrank decode --drafter early-exit:8 --limit 2 --max-new-tokens 10 --temperature T --seed 3 \\
        --shard-size 2 --threads 2 --out OUT        # at commit d6e12a4, before decode/ was reorganised

Re-pinned when retained rows began to be read through cached log-normalizers (``row[x] / T - logsumexp(row
/ T)`` instead of a full log-softmax): only the retained-row columns moved, by float32 rounding (at most
1.3e-5 absolute, 9e-6 relative in ``*_logp``; 4e-6 in the TV diagnostics); tokens, pools, labels and
acceptance are unchanged.
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
    argv = ["decode", "--drafter", "early-exit:8", "--limit", "2", "--max-new-tokens", "10", "--temperature",
            str(temperature), "--seed", "3", "--shard-size", "2", "--threads", "2", "--no-progress", "--no-tracking",
            "--out", str(out)]
    assert main(argv) == 0
    got = pq.read_table(out / "rounds" / "shard-00000-00001.parquet")
    want = pq.read_table(FIXTURES / f"{name}.parquet")
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows > 0
    for column in want.column_names:
        a, b = got.column(column).to_pylist(), want.column(column).to_pylist()
        if a == b:
            continue
        x, y = np.asarray(a, dtype=object).astype(float), np.asarray(b, dtype=object).astype(float)
        if pa.types.is_floating(_leaf(want.schema.field(column).type)):
            # float32 kernels differ in their last bits between CPUs (the fixture was written on another one):
            # probabilities agree to float32 accumulation noise, NaN positions exactly
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=column)
        else:  # tokens, parents, depths, counts: exactly (NaN != NaN in lists, so compared as arrays)
            np.testing.assert_array_equal(x, y, err_msg=column)


def _leaf(t):
    """The element type of a (nested) list type."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t
