"""The decoding law (temperature -> greedy or sampling, argmax or probability labels) is derived in
``specrank.law`` alone; every other module reads it from there."""

import re

import pytest
from source_grep import source_lines_matching

from specrank.law import ARGMAX, GREEDY, PROBABILITY, SAMPLING, Law

# A law derived again: a temperature compared with zero, or a label kind / law name chosen by a condition.
DERIVATIONS = re.compile(r"""(temp\w*\)?\s*==\s*0(\.0)?\b|float\(t\)\s*==\s*0|["'](argmax|probability|greedy|sampling)["']\s+if\b|\bif\b[^\n]*\belse\s+["'](argmax|probability|greedy|sampling)["'])""")


def test_the_law_of_a_temperature():
    assert (Law(0).greedy, Law(0).name, Law(0).label_kind) == (True, GREEDY, ARGMAX)
    assert (Law(0.7).greedy, Law(0.7).name, Law(0.7).label_kind) == (False, SAMPLING, PROBABILITY)
    assert Law.of_label_kind(ARGMAX).name == GREEDY and Law.named(SAMPLING).label_kind == PROBABILITY
    with pytest.raises(ValueError, match="label kind 'logits'"):
        Law.of_label_kind("logits")


def test_the_law_is_derived_in_one_place():
    assert source_lines_matching(DERIVATIONS, "law.py") == []


def test_the_derivation_pattern_finds_a_derivation():
    assert DERIVATIONS.search('kind = "argmax" if temperature == 0 else "probability"')
    assert DERIVATIONS.search("if self.temperature == 0:")
    assert not DERIVATIONS.search("kind = Law(temperature).label_kind")
