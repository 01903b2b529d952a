"""Offline evaluation of selection scores on recorded rounds: tables, a Markdown report and figures.

Kept apart from ``specrank.selection`` (numpy only) because it reads Parquet, renders
figures and feeds MLflow.
"""

from specrank.evaluation.data import Rounds, align_predictions, load_rounds, read_predictions
from specrank.evaluation.figures import gain_vs_budget, render_figures, root_share_by_task
from specrank.evaluation.offline import (
    TABLES,
    Evaluation,
    evaluate,
    evaluate_run,
    load_evaluation,
    save_evaluation,
)
from specrank.evaluation.report import render_report, write_report
from specrank.evaluation.values import BUDGET_SWEEP, HEADLINE_BUDGETS

__all__ = [
    "BUDGET_SWEEP",
    "HEADLINE_BUDGETS",
    "TABLES",
    "Evaluation",
    "Rounds",
    "align_predictions",
    "evaluate",
    "evaluate_run",
    "gain_vs_budget",
    "load_evaluation",
    "load_rounds",
    "read_predictions",
    "render_figures",
    "render_report",
    "root_share_by_task",
    "save_evaluation",
    "write_report",
]
