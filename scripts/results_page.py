"""Publish a study's results in the docs: ``docs/results/study.json``, ``docs/results/learning-curve.png`` and
``docs/results.md`` rendered from that JSON (``tests/test_study.py`` checks that the page is its rendering). A
study of another pair goes beside it under the pair's name: ``docs/results/<pair>/`` and ``docs/results-<pair>.md``.

    .venv/bin/python scripts/results_page.py runs/study
    .venv/bin/python scripts/results_page.py runs/gemma3 --pair gemma3-270m
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from specrank.experiments.study.results_page import TITLE, render_results

DOCS = Path(__file__).resolve().parents[1] / "docs"


def pair_files(pair: str | None) -> tuple[str, str, str]:
    """(the page, its results folder, the page's title) of the default study or of a named pair's, relative to docs/."""
    if pair is None:
        return "results.md", "results", TITLE
    return f"results-{pair}.md", f"results/{pair}", f"{TITLE} on a second pair, {pair}"


def publish(study: Path, docs: Path = DOCS, pair: str | None = None) -> Path:
    results = json.loads((study / "results.json").read_text())
    name, folder, title = pair_files(pair)
    (docs / folder).mkdir(parents=True, exist_ok=True)
    (docs / folder / "study.json").write_text(json.dumps(results, indent=1) + "\n")
    shutil.copyfile(study / "learning-curve.png", docs / folder / "learning-curve.png")
    page = docs / name
    page.write_text(render_results(results, f"{folder}/learning-curve.png", title), encoding="utf-8")
    return page


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a `specrank study --out` directory")
    parser.add_argument("--pair", help="publish beside the default study under this name (e.g. gemma3-270m)")
    args = parser.parse_args(argv)
    print(f"wrote {publish(args.study, pair=args.pair)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
