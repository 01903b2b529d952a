"""Publish a study's results in the docs: ``docs/results/study.json``, ``docs/results/learning-curve.png`` and
``docs/results.md`` rendered from that JSON (``tests/test_study.py`` checks that the page is its rendering).

    .venv/bin/python scripts/results_page.py runs/study
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from specrank.evaluation.study import render_results

DOCS = Path(__file__).resolve().parents[1] / "docs"
FIGURE = "results/learning-curve.png"  # relative to docs/results.md


def publish(study: Path, docs: Path = DOCS) -> Path:
    results = json.loads((study / "results.json").read_text())
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "study.json").write_text(json.dumps(results, indent=1) + "\n")
    shutil.copyfile(study / "learning-curve.png", docs / FIGURE)
    page = docs / "results.md"
    page.write_text(render_results(results, FIGURE), encoding="utf-8")
    return page


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a `specrank study --out` directory")
    print(f"wrote {publish(parser.parse_args(argv).study)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
