"""A reranker kind added through the registry alone runs through cross-fit, evaluate, save/load and online decoding:
the toy kind here touches no other file. Its class stores its fitted state through its own format-2 codec."""

import numpy as np
import pytest
from decode_helpers import saved_tiny_inputs

from specrank.decode import DecodeConfig, Decoder, ModelSpec
from specrank.rerankers import Reranker, load_reranker
from specrank.rerankers import registry
from specrank.rerankers.state import Codec
from specrank.workflow import Rerankers, cross_fit, evaluate, featurize, record

TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read"]


class PowerOfDraft(Reranker):
    """A toy first factor: q ** power_, its power fitted by least squares on a grid."""

    def __init__(self, grid=5):
        self.grid = grid

    def _fit(self, X, y):
        self.features_ = ["q"]
        q = np.asarray(X["q"], dtype=np.float64)
        powers = np.linspace(0.25, 2.0, self.grid)
        self.power_ = float(powers[np.argmin([np.mean((q ** p - y) ** 2) for p in powers])])

    def _predict(self, X):
        return np.asarray(X["q"], dtype=np.float64) ** self.power_


def encode(est):
    return {"power": est.power_}, {}, {}


def decode(est, state, arrays, files):
    est.power_ = float(state["power"])


PowerOfDraft.codec = Codec(encode, decode, {"power": ("a number", lambda v: isinstance(v, float))})
TOY = registry.RerankerKind("power", "Power", "Power of the draft", lambda **_: PowerOfDraft(), role="control")


@pytest.fixture
def toy():
    yield registry.register(TOY, PowerOfDraft)
    registry.KINDS.pop(TOY.name)  # the registry as it was, for the other tests
    registry.CLASSES.pop(PowerOfDraft.__name__)


def test_a_kind_added_through_the_registry_runs_through_every_stage(toy, tmp_path):
    tgt, drf, prompts = saved_tiny_inputs(tmp_path, TEXTS)
    models = ModelSpec(str(tgt), f"standalone:{drf}")
    recording = record(models, prompts, out=tmp_path / "run",
                       config=DecodeConfig(budget=8, extra=4, temperature=1.0, max_new_tokens=8), progress=False)
    features = featurize(recording)
    fitted = cross_fit(features, rerankers=("power", "isotonic"), out=tmp_path / "rerankers")
    assert set(Rerankers.open(fitted.path).names) == {"power", "isotonic"}
    preds = fitted.predictions()
    assert np.isfinite(preds["power"]).all() and not np.allclose(preds["power"], preds["draft"])
    evaluation = evaluate(recording, fitted, out=tmp_path / "evaluation", bootstrap=20)
    assert "power" in set(evaluation.summary["score"]) and "| Power |" in (evaluation.path / "report.md").read_text()
    model = fitted.models("power")[0]
    model.save(tmp_path / "power.zip")
    again = load_reranker(tmp_path / "power.zip")  # format 2 through the toy class's own codec
    assert type(again) is PowerOfDraft and again.power_ == model.power_
    table = features.table()
    np.testing.assert_array_equal(again.predict(table), model.predict(table))
    loaded = models.load()
    dec = Decoder(loaded.target, loaded.drafter, "reranked", reranker=again, budget=8, temperature=1.0)
    assert dec.generate(TEXTS[0], max_new_tokens=6).stats.rounds >= 1


def test_a_taken_name_and_a_class_without_a_codec_are_refused(toy):
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.RerankerKind("rows", "Rows", "Rows", lambda **_: PowerOfDraft()))

    class NoCodec(Reranker):
        pass

    with pytest.raises(ValueError, match="no codec"):
        registry.register(registry.RerankerKind("nocodec", "N", "N", lambda **_: NoCodec()), NoCodec)
    with pytest.raises(ValueError, match="a name is an identifier"):
        registry.RerankerKind("a+b", "A", "A", lambda **_: None)
