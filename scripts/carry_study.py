"""One temperature of a study carried to a study directory on this machine, from its committed piece.

    python scripts/carry_study.py OUT --piece docs/results/pieces/study-t1.json --champion CHAMPION

A study too long for one sitting runs in pieces (docs/study.md, "Carrying a study to another machine"): the offline
part of a temperature writes ``OUT/<temperature>/figures.json`` beside its champion. Its recording is far too large
to keep, so the piece that is kept is that JSON (committed as ``--piece``) and the champion (a saved reranker,
directory or zip). This writes both back into ``OUT/<temperature>/``; ``specrank study --out OUT`` with the same
settings then reads that temperature back instead of recording it, and runs or resumes its online phase.

Refused (exit 2, one line, nothing written) when the piece is not one, the champion does not load, or
``OUT/<temperature>`` already holds a recording.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specrank.atomic import write_json_atomic
from specrank.layout import RunLayout
from specrank.rerankers import load_reranker, save_reranker


def carry(out: Path, piece: dict, champion) -> Path:
    """Write ``piece`` (``{"folder", "settings", "figures"}``) and ``champion`` into ``out/<folder>``; its folder."""
    run = RunLayout(Path(out) / piece["folder"])
    if run.rounds.exists():
        raise ValueError(f"{run.root} holds a recording: it is no carried temperature")
    model = load_reranker(champion)
    run.root.mkdir(parents=True, exist_ok=True)
    save_reranker(model, run.champion)
    write_json_atomic(run.figures, {"settings": piece["settings"], "figures": piece["figures"]})
    return run.root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the study directory (--out of the study that goes on)")
    parser.add_argument("--piece", type=Path, required=True, help="the committed piece: folder, settings, figures")
    parser.add_argument("--champion", type=Path, required=True, help="the piece's champion (a saved reranker)")
    args = parser.parse_args(argv)
    try:
        piece = json.loads(args.piece.read_text(encoding="utf-8"))
        if not isinstance(piece, dict) or not {"folder", "settings", "figures"} <= set(piece):
            raise ValueError(f"{args.piece}: not a study piece (needs folder, settings and figures)")
        run_dir = carry(args.out, piece, args.champion)
    except (OSError, ValueError) as exc:
        print(f"carry_study: {exc}", file=sys.stderr)
        return 2
    print(f"{run_dir}: figures and champion carried; rerun the study's command with --out {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
