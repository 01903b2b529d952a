"""The decoding law (temperature -> greedy or sampling, argmax or probability labels) is derived in
``specrank.law`` alone; every other module reads it from there."""

import re

import pytest
from source_grep import source_lines_matching

from specrank.law import ARGMAX, GREEDY, PROBABILITY, SAMPLING, Law

NAME = r"""["'](argmax|probability|greedy|sampling)["']"""
# A law derived again: a temperature compared with zero; a law name or label kind compared, chosen by a condition or
# listed again; a label column chosen by a condition or mapped from a name.
DERIVATIONS = re.compile(
    r"""temp\w*\)?\s*==\s*0(\.0)?\b|float\(t\)\s*==\s*0"""
    rf"""|[=!]=\s*{NAME}|{NAME}\s*[=!]=|\bin\s*\(\s*{NAME}"""
    rf"""|{NAME}\s+if\b|\bif\b[^\n]*\belse\s+{NAME}"""
    rf"""|\(\s*{NAME}\s*,\s*{NAME}\s*\)"""
    r"""|p_argmax_child["']\]?\s+if\b|\belse\s+[\w.\[]*["']?p_edge\b"""
    rf"""|{NAME}\s*:\s*["']p_(edge|argmax_child)["']""")
# Each way the mapping was once written a second time, which the pattern must find (its negative control).
SECOND_HOMES = [
    'LABEL_SOURCE = {"probability": "p_edge", "argmax": "p_argmax_child"}',
    'edge = record["p_argmax_child"] if law == "greedy" else record["p_edge"]',
    'if self.label_kind_ == "argmax":',
    '"objective": "binary" if self.label_kind_ == "argmax" else "cross_entropy",',
    'LAWS = ("sampling", "greedy")',
    'eligible = target.any(axis=1) if rounds.law == "greedy" else np.ones(n, dtype=bool)',
    'kind = "argmax" if temperature == 0 else "probability"',
    "if self.temperature == 0:",
    'edge = pool.p_argmax_child if greedy else pool.p_edge',
    'if kind in ("argmax", "probability"):',
]


def test_the_law_of_a_temperature():
    assert (Law(0).greedy, Law(0).name, Law(0).label_kind) == (True, GREEDY, ARGMAX)
    assert (Law(0.7).greedy, Law(0.7).name, Law(0.7).label_kind) == (False, SAMPLING, PROBABILITY)
    assert Law.of_label_kind(ARGMAX).name == GREEDY and Law.named(SAMPLING).label_kind == PROBABILITY
    with pytest.raises(ValueError, match="label kind 'logits'"):
        Law.of_label_kind("logits")


def test_the_law_is_derived_in_one_place():
    assert source_lines_matching(DERIVATIONS, "law.py") == []


@pytest.mark.parametrize("line", SECOND_HOMES)
def test_the_derivation_pattern_finds_a_second_home(line):
    assert DERIVATIONS.search(line)


def test_the_derivation_pattern_passes_the_law_read_from_its_home():
    for line in ["kind = Law(temperature).label_kind", "edge = record[Law.of(law).label_column]",
                 "if Law.of_label_kind(self.label_kind_).binary_labels:", 'PAPER = {"greedy": (2.22, 4.51)}',
                 'def draft_score(pool, law: str = "sampling"):', "name = Law(temp).folder"]:
        assert not DERIVATIONS.search(line), line


def test_a_second_home_written_into_the_package_is_found(tmp_path, monkeypatch):
    import source_grep

    (tmp_path / "law.py").write_text("GREEDY = 'greedy'\n")
    (tmp_path / "elsewhere.py").write_text("def f(record, law):\n    return " + SECOND_HOMES[1] + "\n")
    monkeypatch.setattr(source_grep, "SRC", tmp_path)
    assert source_grep.source_lines_matching(DERIVATIONS, "law.py") == [
        "elsewhere.py:2: return " + SECOND_HOMES[1]]


def test_the_label_column_and_kinds_follow_the_law():
    assert (Law(0).label_column, Law(1).label_column) == ("p_argmax_child", "p_edge")
    assert Law(0).binary_labels and not Law(0.5).binary_labels
    assert (Law(0).folder, Law(1).folder, Law(0.7).folder) == ("greedy", "t1", "t0.7")
    assert Law.of("greedy") == Law(0) and Law.of(Law(0.7)) == Law(0.7)
