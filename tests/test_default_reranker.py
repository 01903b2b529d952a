"""``reranker:default``: the champion that fits the decoding temperature, the cache's before the shipped one, and
``reranked`` without a reranker only with the drafter the champions were trained with."""

import numpy as np
import pandas as pd
import pytest

from specrank.decode.decoder import named_champion
from specrank.decode.strategies import StrategyError
from specrank.featurize.features import META_KEY
from specrank.rerankers import IsotonicFirstFactor
from specrank.rerankers.defaults import (DEFAULT, DefaultRerankerError, cached_reranker_dir, default_reranker_dir,
                                         load_default_reranker, shipped_reranker_dir)


def tiny_isotonic(kind: str):
    rng = np.random.default_rng(0)
    q = rng.uniform(size=200)
    features = pd.DataFrame({"q": q, "label": (q > 0.5).astype(float) if kind == "argmax" else q})
    features.attrs[META_KEY] = {"label_kind": kind, "topk": 8}
    return IsotonicFirstFactor(n_bins=4).fit(features)


class Spec:
    def __init__(self, spec):
        self.spec = spec


def test_a_champion_in_the_cache_wins_and_fits_the_temperature(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    tiny_isotonic("probability").save(cached_reranker_dir("sampling"))
    tiny_isotonic("argmax").save(cached_reranker_dir("greedy"))
    assert default_reranker_dir(1.0) == cached_reranker_dir("sampling")
    assert default_reranker_dir(0.7) == cached_reranker_dir("sampling")
    assert default_reranker_dir(0.0) == cached_reranker_dir("greedy")
    assert load_default_reranker(0.0).label_kind_ == "argmax"
    assert load_default_reranker(1.0).label_kind_ == "probability"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{DEFAULT} (greedy): {cached_reranker_dir('greedy')}",
                   f"{DEFAULT} (sampling): {cached_reranker_dir('sampling')}"]  # the load line names the file


def test_without_a_cached_champion_the_shipped_one_or_a_one_line_error(tmp_path, monkeypatch):
    import specrank.rerankers.defaults as defaults

    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    for law, t in (("sampling", 1.0), ("greedy", 0.0)):
        assert default_reranker_dir(t) == shipped_reranker_dir(law)  # a format-2 zip in the package
    monkeypatch.setattr(defaults, "shipped_reranker_dir", lambda law, name="default": tmp_path / "none" / f"{law}.zip")
    for law, t in (("sampling", 1.0), ("greedy", 0.0)):
        with pytest.raises(DefaultRerankerError, match=f"no {law} champion"):
            default_reranker_dir(t)
    with pytest.raises(DefaultRerankerError, match=r"^reranker:gemma3-270m: no greedy champion .*`make study-gemma3`"):
        default_reranker_dir(0.0, "gemma3-270m")  # a missing champion names the make target that installs one
    with pytest.raises(DefaultRerankerError, match="no such named champion .*reranker:gemma3-270m"):
        defaults.champion_name("reranker:llama")


def test_reranked_without_a_reranker_takes_the_champions_of_its_named_head():
    assert named_champion("reranked", None, Spec("eagle3:default")) == "default"
    assert named_champion("reranked", DEFAULT, Spec("eagle3:default")) == "default"
    assert named_champion("reranked", None, Spec("eagle3:gemma3-270m")) == "gemma3-270m"  # by the pair it fits
    assert named_champion("reranked", "reranker:gemma3-270m", Spec("early-exit:8")) == "gemma3-270m"  # as named
    assert named_champion("draft", None, Spec("early-exit:8")) is None
    assert named_champion("reranked", tiny_isotonic("argmax"), Spec("early-exit:8")) is None
    with pytest.raises(StrategyError, match=r"needs a reranker \(reranker=\) for drafter early-exit:8"):
        named_champion("reranked", None, Spec("early-exit:8"))
