"""``specrank report``: re-render the Markdown report and figures from a saved evaluation's tables."""

from __future__ import annotations

from specrank.evaluation import load_evaluation, write_report
from specrank.outputs import check_output_dir, staged



def add_arguments(parser) -> None:
    parser.add_argument("eval_dir", metavar="EVAL_DIR", help="output directory of 'specrank evaluate'")
    parser.add_argument("--out", default=None, help="where to write report.md and figures/ (default EVAL_DIR)")


def run(args) -> int:
    evaluation = load_evaluation(args.eval_dir)
    out = check_output_dir(args.out or args.eval_dir)
    with staged(out) as stage:
        write_report(evaluation, stage)
    print(f"report -> {out}/report.md")
    return 0
