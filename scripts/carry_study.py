"""One temperature of a study carried to a study directory on this machine, from its committed piece.

    python scripts/carry_study.py OUT --piece docs/results/pieces/study-t1.json --champion CHAMPION [--online ZIP]

A study too long for one sitting runs in pieces (docs/study.md, "Carrying a study to another machine"): the offline
part of a temperature writes ``OUT/<temperature>/figures.json`` beside its champion. Its recording is far too large
to keep, so the piece that is kept is that JSON (committed as ``--piece``) and the champion (a saved reranker,
directory or zip). This writes both back into ``OUT/<temperature>/``; ``specrank study --out OUT`` with the same
settings then reads that temperature back instead of recording it, and runs or resumes its online phase. The
online cells already decoded (``OUT/<temperature>/online/B<budget>/``, a few hundred kB each) may be kept too, as a
zip of those folders (``--online``): they are not decoded again.

Refused (exit 2, one line, nothing written) when the piece is not one, the champion does not load, or
``OUT/<temperature>`` already holds a recording.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

from specrank.atomic import write_json_atomic
from specrank.experiments.online.comparison import TABLES
from specrank.layout import RunLayout
from specrank.rerankers import load_reranker, save_reranker


CELL_FILE = re.compile(r"B\d+/[\w.-]+\.(parquet|png)")  # an online cell's tables and figure


def online_cells(archive: Path) -> list[str]:
    """The file names of a zip of online cells (``B<budget>/...``), refused unless every one is a cell's."""
    with zipfile.ZipFile(archive) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
    odd = [n for n in names if not CELL_FILE.fullmatch(n)]
    if not names or odd:
        raise ValueError(f"{archive}: not a zip of online cells (B<budget>/online_*.parquet)"
                         + (f": {odd[0]}" if odd else ""))
    for cell in sorted({n.split("/")[0] for n in names}):
        missing = [t for t in TABLES if f"{cell}/{t}.parquet" not in names]
        if missing:
            raise ValueError(f"{archive}: online cell {cell} has no {missing[0]}.parquet")
    return names


def carry(out: Path, piece: dict, champion, online: Path | None = None) -> Path:
    """Write ``piece`` (``{"folder", "settings", "figures"}``), ``champion`` and the ``online`` cells (a zip, or
    None) into ``out/<folder>``; its folder."""
    run = RunLayout(Path(out) / piece["folder"])
    if run.rounds.exists():
        raise ValueError(f"{run.root} holds a recording: it is no carried temperature")
    names = online_cells(online) if online is not None else []
    cells = run.root / "online"
    if names and cells.exists() and any(cells.iterdir()):
        raise ValueError(f"{cells} already holds online cells")
    model = load_reranker(champion)
    run.root.mkdir(parents=True, exist_ok=True)
    save_reranker(model, run.champion)
    write_json_atomic(run.figures, {"settings": piece["settings"], "figures": piece["figures"]})
    if names:
        with zipfile.ZipFile(online) as z:
            z.extractall(cells, members=names)
    return run.root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the study directory (--out of the study that goes on)")
    parser.add_argument("--piece", type=Path, required=True, help="the committed piece: folder, settings, figures")
    parser.add_argument("--champion", type=Path, required=True, help="the piece's champion (a saved reranker)")
    parser.add_argument("--online", type=Path, default=None,
                        help="the piece's online cells already decoded: a zip of B<budget>/ folders")
    args = parser.parse_args(argv)
    try:
        piece = json.loads(args.piece.read_text(encoding="utf-8"))
        if not isinstance(piece, dict) or not {"folder", "settings", "figures"} <= set(piece):
            raise ValueError(f"{args.piece}: not a study piece (needs folder, settings and figures)")
        run_dir = carry(args.out, piece, args.champion, args.online)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"carry_study: {exc}", file=sys.stderr)
        return 2
    print(f"{run_dir}: figures, champion{' and online cells' if args.online else ''} carried; rerun the study's"
          f" command with --out {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
