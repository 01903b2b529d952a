"""Paired prompt bootstrap: exact against a brute-force resampler, paired, seeded, split-consistent."""

import numpy as np
import pytest

from specrank.selection.draws import draw_values, equal_mean, pearl_curves
from specrank.selection.select import SelectionError
from specrank.selection.stats import PromptBootstrap, quintile_labels, score_table
from specrank.selection.synthetic import random_pool


def data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    prompt = np.sort(rng.integers(0, 40, n)) * 7 + 3  # non-contiguous ids
    draft = rng.random(n) * 3
    return prompt, {"draft": draft, "root": draft + rng.random(n), "oracle": draft + 2 * rng.random(n) + 1}


def test_resampled_ratios_match_brute_force_resampling():
    prompt, cols = data()
    boot = PromptBootstrap(prompt, n_resamples=25, seed=4)
    got = boot.totals(cols)
    draws = np.random.default_rng(4).integers(0, len(np.unique(prompt)), size=(25, len(np.unique(prompt))))
    ids = np.unique(prompt)
    for r in range(25):
        rows = np.concatenate([np.flatnonzero(prompt == ids[k]) for k in draws[r]])
        d, r_, o = (cols[k][rows].sum() for k in ("draft", "root", "oracle"))
        want = (r_ - d) / (o - d)
        a = got.boot[r]
        share = (a[1] - a[0]) / (a[2] - a[0])
        assert share == pytest.approx(want, rel=1e-12)
        assert a[3] == len(rows)


def test_point_estimates_are_ratios_of_sums():
    prompt, cols = data()
    tot = PromptBootstrap(prompt, n_resamples=200).totals(cols)
    d, r, o = cols["draft"], cols["root"], cols["oracle"]
    assert tot.mean("root").point == pytest.approx(r.mean())
    assert tot.gain("root", "draft").point == pytest.approx((r - d).mean())
    assert tot.gain_pct("root", "draft").point == pytest.approx(100 * (r.sum() - d.sum()) / d.sum())
    assert tot.share("root", "draft", "oracle").point == pytest.approx(100 * (r - d).sum() / (o - d).sum())
    low, point, high = tot.gain("root", "draft").low, tot.gain("root", "draft").point, tot.gain("root", "draft").high
    assert low < point < high


def test_pairing_makes_a_constant_shift_exact():
    # every rule is resampled with the same prompts, so a per-round constant gain has no spread
    prompt, cols = data()
    cols["shifted"] = cols["draft"] + 0.25
    gain = PromptBootstrap(prompt, n_resamples=300).totals(cols).gain("shifted", "draft")
    assert gain.low == pytest.approx(0.25) and gain.high == pytest.approx(0.25)
    spread = PromptBootstrap(prompt, n_resamples=300).totals(cols).gain("root", "draft")
    assert spread.high > spread.low  # a noisy gain does have spread


def test_seeded_and_reproducible():
    prompt, cols = data()
    a = PromptBootstrap(prompt, 100, seed=1).totals(cols).gain_pct("root", "draft")
    b = PromptBootstrap(prompt, 100, seed=1).totals(cols).gain_pct("root", "draft")
    c = PromptBootstrap(prompt, 100, seed=2).totals(cols).gain_pct("root", "draft")
    assert tuple(a) == tuple(b) and tuple(a) != tuple(c)


def test_splits_share_resamples_and_add_up():
    prompt, cols = data()
    boot = PromptBootstrap(prompt, 50, seed=3)
    labels = quintile_labels(cols["draft"])
    assert np.bincount(labels).tolist() == [60] * 5
    parts = boot.split(cols, labels)
    np.testing.assert_allclose(sum(t.boot for t in parts.values()), boot.totals(cols).boot)


def test_equal_mean_gain_point_matches_per_round_matching():
    pool = random_pool(120, 30, 4, seed=5)
    rd_v, rd_s = draw_values(pool, [6])["root_draw"]
    vc, sc = pearl_curves(pool)
    em = equal_mean(vc, sc, rd_s.mean())
    boot = PromptBootstrap(pool.prompt_id, 200, seed=0)
    gain = boot.equal_mean_gain(rd_v[:, 0], rd_s[:, 0], vc, sc)
    assert gain.point == pytest.approx(rd_v.mean() - em.values.mean(), abs=1e-12)
    assert gain.low <= gain.point <= gain.high


def test_rule_table_rows_and_columns():
    prompt, cols = data()
    values = {k: np.column_stack([v, v * 1.1]) for k, v in cols.items()}
    tab = score_table(PromptBootstrap(prompt, 50), values, [8, 59], labels=prompt % 2)
    assert len(tab) == 2 * 3 * 2
    row = tab[(tab.score == "root") & (tab.budget == 8) & (tab.split == 0)].iloc[0]
    assert row.gain_low <= row.gain <= row.gain_high and not np.isnan(row.oracle_share)
    assert np.isnan(tab[tab.score == "draft"].oracle_share).all()


def test_bad_inputs_name_the_field():
    prompt, cols = data()
    with pytest.raises(SelectionError, match="^prompt_ids:"):
        PromptBootstrap(prompt.reshape(-1, 2))
    boot = PromptBootstrap(prompt, 10)
    with pytest.raises(SelectionError, match="^root:"):
        boot.totals({"root": cols["root"][:-1]})
    with pytest.raises(SelectionError, match="^mask:"):
        boot.totals(cols, mask=np.ones(3, bool))
    with pytest.raises(SelectionError, match="^column:"):
        boot.totals(cols).mean("nope")


def test_equal_mean_gain_rematches_inside_each_resample():
    from specrank.selection.stats import _matched_gain, _per_prompt

    pool = random_pool(90, 30, 4, seed=6)
    rd_v, rd_s = (a[:, 0] for a in draw_values(pool, [5])["root_draw"])
    vc, sc = pearl_curves(pool)
    boot = PromptBootstrap(pool.prompt_id, 3, seed=2)
    cols = np.column_stack([rd_v, rd_s, np.ones(len(rd_v))])
    sums = [_per_prompt(boot.prompt_index, len(boot.prompts), a) for a in (cols, vc, sc)]
    got = _matched_gain(*(boot.weights @ s for s in sums), pct=False)
    for r in range(3):
        rows = np.repeat(np.arange(len(rd_v)), boot.weights[r][boot.prompt_index].astype(int))
        em = equal_mean(vc[rows], sc[rows], rd_s[rows].mean())
        assert got[r] == pytest.approx(rd_v[rows].mean() - em.values.mean(), abs=1e-12)


def test_nan_in_excluded_rounds_does_not_leak_into_a_split():
    prompt, cols = data()
    cols["root"] = cols["root"].copy()
    cols["root"][:5] = np.nan
    labels = np.r_[np.zeros(5, int), np.ones(len(prompt) - 5, int)]
    part = PromptBootstrap(prompt, 20).split(cols, labels)[1]
    assert np.isfinite(part.mean("root").point) and np.isfinite(part.boot).all()
