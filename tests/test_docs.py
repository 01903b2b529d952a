"""The manual: it builds strictly, it names no document outside the repository, and every figure it quotes
from a results file matches that file."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# References a reader of the repository cannot follow: design notes and papers by their private file names,
# work items by number. Written as patterns that do not match their own text.
FORBIDDEN = [
    re.compile(r"\bseeds?[ _-]?0{2}[0-9]\b", re.IGNORECASE),
    re.compile(r"\b(first|second)\s+seed\b", re.IGNORECASE),
    re.compile(r"\bSPEC\s*§"),
    re.compile(r"\b(SPEC|DESIGN)\.md\b"),
    re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    re.compile(r"\.\./shared\b"),
]

# A quoted figure: a number immediately followed by `<!-- from PATH: KEY -->` or `<!-- from PATH: KEY / 60 -->`.
MARKER = re.compile(r"([−+-]?\d[\d,]*(?:\.\d+)?)<!-- from (\S+): ([^\s/*]+)(?: ([/*]) ([\d.]+))? -->")


def tracked_text_files():
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True,
                               timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):  # a source tree without git: every file under the root
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    for name in names:
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary: weights, parquet, images
        yield name, data.decode("utf-8", errors="replace")


def test_the_repository_names_no_outside_document_and_no_work_item():
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for name, text in tracked_text_files() for pattern in FORBIDDEN for m in pattern.finditer(text)]
    assert not hits, "cite papers by short title and arXiv id, and the design by docs/design.md:\n" + "\n".join(hits)


def test_the_reference_patterns_catch_what_they_forbid():
    bad = ["as in " + "seed " + "000 App. D.14", "the " + "second " + "seed", "SPEC " + "§3", "issue " + "18",
           ".." + "/shared/x", "see " + "DESIGN" + ".md"]
    assert all(any(p.search(b) for p in FORBIDDEN) for b in bad)
    assert not any(p.search("target-row reuse, arXiv 2610.29210, App. D.8; SPECRANK_CACHE; seed=0")
                   for p in FORBIDDEN)


def lookup(data, key: str):
    for part in key.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def quoted_mismatches(text: str, where: str) -> tuple[int, list[str]]:
    """(figures checked, mismatches) for every marked figure of ``text``: the quoted number must equal the file's
    value rounded to the quoted decimals."""
    bad, count = [], 0
    if text.count("<!-- from ") != len(MARKER.findall(text)):  # e.g. "1.3%<!-- from …": the marker checks nothing
        bad.append(f"{where}: a '<!-- from' marker not right after its number (put units after the marker)")
    for m in MARKER.finditer(text):
        quoted, path, key, op, operand = m.groups()
        count += 1
        source = ROOT / path
        if not source.is_file():
            bad.append(f"{where}: {path} does not exist (quote no figure before its results file is committed)")
            continue
        value = float(lookup(json.loads(source.read_text(encoding="utf-8")), key))
        if op:
            value = value / float(operand) if op == "/" else value * float(operand)
        number = quoted.replace(",", "").replace("−", "-")
        decimals = len(number.split(".")[1]) if "." in number else 0
        if abs(float(number) - value) > 0.5 * 10 ** -decimals + 1e-9:
            bad.append(f"{where}: quotes {quoted} for {path}: {key}{f' {op} {operand}' if op else ''} = {value:g}")
    return count, bad


def test_every_quoted_figure_matches_its_results_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    checked, bad = 0, []
    for page in pages:
        n, mismatches = quoted_mismatches(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))
        checked, bad = checked + n, bad + mismatches
    assert checked >= 4 and not bad, "\n".join(bad)


def test_a_misquoted_figure_fails_the_check():
    minutes = round(json.loads((ROOT / "docs/results/study.json").read_text(encoding="utf-8"))["timing"]["total_s"] / 60)
    good = f"{minutes}<!-- from docs/results/study.json: timing.total_s / 60 --> minutes"
    assert quoted_mismatches(good, "x") == (1, [])
    assert quoted_mismatches(good.replace(f"{minutes}<", f"{minutes + 5}<"), "x")[1]
    assert quoted_mismatches(good.replace(f"{minutes}<", f"{minutes}%<"), "x")[1]  # a unit between hides the figure
    assert quoted_mismatches("3<!-- from benchmarks/results/none.json: a -->", "x")[1]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_docs_build_strictly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
