"""Chain speculative decoding with one-position rules: exactness, induced laws, recorded diagnostics."""


import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from specrank import schema
from specrank.decode.runs.chain import ChainConfigError, chain_config, decode_chain_prompt
from specrank.decode.config import DecodeConfig
from specrank.decode.runs.lossy import lossy_decode_run, read_diagnostics
from specrank.decode.core import PoolShape
from specrank.decode.prompts import Prompt
from specrank.decode.runs.tables import read_rounds
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import Lossless

from decode_helpers import noisy_drafter, tiny_target
from verify_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)

PROMPT = [2, 5, 7, 16, 25, 19, 3, 2, 6]
VOCAB = 16
SHORT = [2, 5, 7, 9, 11, 6]  # ids below VOCAB
DRAWS = 200




class AcceptAll(Lossless):
    """Negative control: accepts every draft, so it emits the drafter's law, not the target's."""

    def h(self, p, q):
        return torch.ones_like(p)


@pytest.mark.parametrize("scale, length", [(0.0, 3), (0.05, 1), (0.05, 4), (0.5, 2)])
def test_greedy_chain_equals_target_greedy(scale, length):
    target = tiny_target()
    drafter = noisy_drafter(target.model, scale)
    out, records, diags = decode_chain_prompt(target, drafter, PROMPT, chain_config(length, 0.0, 20), Lossless())
    with torch.no_grad():
        ref = target.model.generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False)[0, len(PROMPT):]
    assert out == ref.tolist()
    if scale == 0.0:  # the target drafting for itself: every chain is accepted, bonus tokens included
        assert all(r["accepted"] == length for r in records[:-1])
    assert [len(d["token"]) for d in diags] == [r["accepted"] + 1 for r in records]
    assert max(float(np.max(d["tv"])) for d in diags) == 0.0


def test_greedy_chain_with_an_eagle3_head_equals_target_greedy(tmp_path):
    from specrank.decode.loading.eagle3 import load_eagle3
    from specrank.testing import save_tiny_eagle3

    target = tiny_target()
    drafter = load_eagle3(save_tiny_eagle3(tmp_path / "head", target.model.config), target)
    out, records, _ = decode_chain_prompt(target, drafter, PROMPT, chain_config(3, 0.0, 12), Lossless())
    with torch.no_grad():
        ref = target.model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False)[0, len(PROMPT):]
    assert out == ref.tolist() and all(r["n_scored"] == 4 for r in records)


def first_tokens(target, drafter, rule, n, temperature=1.0):
    """The first emitted token of ``n`` independently seeded chain decodes of SHORT."""
    config = [chain_config(1, temperature, 1, seed) for seed in range(n)]
    return torch.tensor([decode_chain_prompt(target, drafter, SHORT, c, rule)[0][0] for c in config])


def rows_at_prompt(target, drafter):
    """(p, q) at the last prompt position, temperature 1, float64."""
    with torch.no_grad():
        p = torch.softmax(target.model(torch.tensor([SHORT])).logits[0, -1].double(), -1)
        q = torch.softmax(drafter.model(torch.tensor([SHORT])).logits[0, -1].double(), -1)
    return p, q


def chi_square_pvalue(samples, law):
    counts = np.bincount(samples.numpy(), minlength=len(law)).astype(float)
    law = law.numpy()
    if counts[law <= 0].sum():
        return 0.0
    keep = law > 1e-12
    return float(stats.chisquare(counts[keep], law[keep] / law[keep].sum() * counts.sum()).pvalue)


@pytest.fixture(scope="module")
def sampling_pair():
    target = tiny_target(VOCAB, num_layers=1, initializer_range=0.15)
    drafter = noisy_drafter(target.model, 1.0, seed=4)
    p, q = rows_at_prompt(target, drafter)
    return target, drafter, p, q


def chi_square_distance(law, p):
    """Expected chi-square statistic per draw when drawing ``law`` and testing against ``p``."""
    return float(((law - p) ** 2 / p).sum())


@pytest.mark.parametrize("spec", ["lossless", "lenience:l=0.3", "speccascade:p_base=0.3", "accept-all"])
def test_first_token_law_in_the_decoder(sampling_pair, spec):
    target, drafter, p, q = sampling_pair
    rule = AcceptAll() if spec == "accept-all" else parse_verification_rule(spec)
    law = q if spec == "accept-all" else rule.induced(p[None], q[None])[0]
    tokens = first_tokens(target, drafter, rule, DRAWS)
    assert chi_square_pvalue(tokens, law) > 1e-3
    if spec != "lossless":  # negative controls: these draws do not follow the target
        assert DRAWS * chi_square_distance(law, p) > 80  # enough power for the check below
        assert chi_square_pvalue(tokens, p) < 1e-4


def test_chain_config_is_refused_for_pools():
    target = tiny_target()
    with pytest.raises(ChainConfigError, match="PoolShape"):
        decode_chain_prompt(target, noisy_drafter(target.model, 0.1), PROMPT, DecodeConfig(PoolShape(2, 3, 2), 5, 0),
                            Lossless())
    with pytest.raises(ChainConfigError, match="positive"):
        chain_config(0)


@pytest.mark.parametrize("speculation, spec", [("chain", "typical:eps=0.1"), ("tree", "speccascade:p_base=0.3")])
def test_run_records_diagnostics_beside_rounds(tmp_path, speculation, spec):
    target = tiny_target(48)
    drafter = noisy_drafter(target.model, 0.3, seed=2)
    config = (chain_config(3, 1.0, 10, 1) if speculation == "chain"
              else DecodeConfig(PoolShape(3, 3, 3), 6, 0, 1.0, 10, 1))
    prompts = [Prompt(f"p{i}", "t", text) for i, text in enumerate(["the cat", "a dog and", "red sun"])]
    manifest = {"target": "tiny"}
    rule = parse_verification_rule(spec)
    lossy_decode_run(target, drafter, prompts, tmp_path, config, manifest, rule, speculation, 2, progress=False)
    rounds, diag = read_rounds(tmp_path), read_diagnostics(tmp_path)
    assert list(rounds.columns) == schema.ROUNDS_COLUMNS
    assert sorted(p.name for p in (tmp_path / "diagnostics").iterdir()) == sorted(
        p.name for p in (tmp_path / "rounds").iterdir())
    per_round = diag.groupby(["prompt_id", "round"]).size()
    expected = rounds.set_index(["prompt_id", "round"])["accepted"] + 1
    pd.testing.assert_series_equal(per_round.sort_index(), expected.sort_index(), check_names=False,
                                   check_dtype=False)
    assert (diag.loc[diag["accepted"], "step"] < diag.loc[diag["accepted"], "round_accepted"]).all()
    assert diag["tv_truncated"].notna().all() and (diag["tv_truncated"] > 1e-6).any()
    if speculation == "chain":
        assert rounds["token"].map(len).eq(3).all() and (rounds["n_scored"] == 4).all()
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.parquet")}
    lossy_decode_run(target, drafter, prompts, tmp_path, config, manifest, rule, speculation, 2, progress=False)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.parquet")} == before  # resumed: nothing redone
