"""Two study directories made by the same command, compared table by table: the regression check of a refactor.

    python scripts/compare_studies.py BEFORE AFTER

Run the same small seeded study before and after a change (`specrank study --out BEFORE ... --seed 0`, then the
same command with `--out AFTER` on the changed code). Each temperature's recorded rounds (the decoded tokens), its
features, edges, held-out predictions, every evaluation table and the online comparison's tables must be equal cell
for cell, leaving out only what the clock measured (seconds, tokens/s, speed ratios, the reranker's cost); the results
JSON must be equal once the command line, commit, machine and seconds are set aside; the results page too, with the
online tables' tokens/s column and the reranker's measured cost masked. A results JSON that keys the scores under
their former name, ``rules``, is read as keying them under ``scores``.

Prints one line per difference and a summary; exits 1 when anything differs, 2 when a directory is not a study.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

# What the clock measured: never equal between two runs.
TIMED_COLUMN = re.compile(r"(_s|_ms|_share|seconds|speed|ratio)$|^time")
TIMED_KEYS = {"command", "commit", "machine", "timing", "speed", "break_even"}
TABLES = ("features.parquet", "edges.parquet", "rerankers/predictions.parquet", "rerankers/edge_predictions.parquet")


def run_tables(run: Path) -> list[str]:
    """The tables of one temperature's folder, relative to it: rounds, stage outputs, evaluation and online tables."""
    found = ["rounds"] + [t for t in TABLES if (run / t).is_file()]
    found += [str(f.relative_to(run)) for f in sorted((run / "evaluation").glob("*.parquet"))]
    found += [str(f.relative_to(run)) for f in sorted((run / "online").glob("*/online_*.parquet"))
              if f.name != "online_speed.parquet"]  # speeds only: every value timed
    return found


def read_table(path: Path) -> pd.DataFrame:
    """A Parquet file, or a folder of Parquet shards concatenated in name order."""
    if path.is_dir():
        return pd.concat([pd.read_parquet(f) for f in sorted(path.glob("*.parquet"))], ignore_index=True)
    return pd.read_parquet(path)


def table_differences(before: Path, after: Path, name: str) -> list[str]:
    """One line per way the two copies of table ``name`` differ (timed columns left out)."""
    if not (after / name).exists():
        return [f"{name}: missing after"]
    a, b = read_table(before / name), read_table(after / name)
    if list(a.columns) != list(b.columns):
        return [f"{name}: columns {list(a.columns)} before, {list(b.columns)} after"]
    kept = [c for c in a.columns if not TIMED_COLUMN.search(c)]
    try:
        pd.testing.assert_frame_equal(a[kept], b[kept], check_exact=True)
    except AssertionError as exc:
        return [f"{name}: {' '.join(str(exc).split())[:300]}"]
    return []


def comparable(results) -> object:
    """The results JSON without what differs between two runs of one command, scores keyed ``scores``."""
    if isinstance(results, dict):
        return {("scores" if k == "rules" else k): comparable(v) for k, v in results.items() if k not in TIMED_KEYS}
    if isinstance(results, list):
        return [comparable(v) for v in results]
    return results


def comparable_page(text: str) -> str:
    """The results page without its command and commit lines, the online tables' last column and the reranker's
    measured cost."""
    out, online = [], False
    for line in text.splitlines():
        if line.startswith(("- Command:", "- Commit:")):
            continue
        online = online or line.startswith("## Offline vs online")
        if online and line.startswith("|") and not set(line) <= set("|-"):
            line = "|".join(line.split("|")[:-2]) + "| (timed) |"
        out.append(re.sub(r"cost [0-9.]+ ms a round: break-even gain on a [0-9.]+ ms GPU round [0-9.]+ ",
                          "cost (timed) ", line))
    return "\n".join(out)


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(tables found equal, one line per difference) between two study directories."""
    for d in (before, after):
        if not (d / "results.json").is_file():
            raise FileNotFoundError(f"{d}: not a finished study (no results.json)")
    differences, equal = [], 0
    a, b = (json.loads((d / "results.json").read_text(encoding="utf-8")) for d in (before, after))
    settings_added = set(b.get("settings", {})) - set(a.get("settings", {}))
    a_cmp, b_cmp = comparable(a), comparable(b)
    for key in settings_added:  # a setting the later code writes and the earlier did not: not a difference
        b_cmp["settings"].pop(key)
    if a_cmp != b_cmp:
        differences += [f"results.json: {k} differs" for k in sorted(set(a_cmp) | set(b_cmp))
                        if a_cmp.get(k) != b_cmp.get(k)]
    for folder in sorted(d.name for d in before.iterdir() if (d / "rounds").is_dir()):
        for name in run_tables(before / folder):
            found = table_differences(before / folder, after / folder, name)
            differences += [f"{folder}/{line}" for line in found]
            equal += not found
    pages = [comparable_page((d / "results.md").read_text(encoding="utf-8")) for d in (before, after)]
    if pages[0] != pages[1]:
        differences.append("results.md differs")
    return equal, differences


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the study directory made before the change")
    parser.add_argument("after", type=Path, help="the same command's directory after it")
    args = parser.parse_args(argv)
    try:
        equal, differences = compare(args.before, args.after)
    except FileNotFoundError as exc:
        print(f"compare_studies: error: {exc}", file=sys.stderr)
        return 2
    for line in differences:
        print(line)
    print(f"{equal} tables equal cell for cell; {len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
