"""The study's per-task table: each task's figures from its own rounds, with the study's resamples."""

import numpy as np
import pytest

from specrank.experiments.study.tasks import task_figures, task_section
from specrank.selection.stats import PromptBootstrap


@pytest.fixture(scope="module")
def rounds():
    rng = np.random.default_rng(0)
    prompts = np.repeat([f"p{i}" for i in range(40)], 25)  # 40 prompts of 25 rounds
    task = np.repeat(["rag", "writing"] * 20, 25)
    draft = rng.uniform(0.2, 0.4, size=(len(prompts), 2))
    root = draft + 0.2
    base = draft + 0.05
    rows = base + np.where(task == "rag", 0.1, 0.0)[:, None]  # rows beats base in RAG only
    return task, prompts, {"draft": draft, "base": base, "rows": rows, "root": root}


def test_each_task_reads_its_own_rounds(rounds):
    task, prompts, values = rounds
    figures = task_figures(PromptBootstrap(prompts, 500, seed=0), task, prompts, values, budgets=(1, 8))
    assert set(figures) == {"rag", "writing"}
    rag, writing = figures["rag"]["budgets"]["8"], figures["writing"]["budgets"]["8"]
    assert figures["rag"]["rounds"] == 500 and figures["rag"]["prompts"] == 20
    assert rag["rows_minus_base_pct_of_draft"][1] > 0  # rows gains over base where it should
    assert writing["rows_minus_base_pct_of_draft"] == pytest.approx([0, 0, 0], abs=1e-9)  # and nowhere else
    assert rag["root_share"]["rows"][0] == pytest.approx(75.0) and writing["root_share"]["rows"][0] == pytest.approx(25.0)
    assert set(rag["root_share"]) == {"base", "rows"}  # the rerankers only: no draft, no root
    page = "\n".join(task_section(figures, "rows"))
    assert "| rag | 500 | 20 |" in page and "75.0 [" in page


def test_a_budget_the_study_did_not_score_is_left_out(rounds):
    task, prompts, values = rounds
    figures = task_figures(PromptBootstrap(prompts, 100, seed=0), task, prompts,
                           {k: v[:, 1:] for k, v in values.items()}, budgets=(8,))
    assert set(figures["rag"]["budgets"]) == {"8"}
    rag = next(line for line in task_section(figures, "rows") if line.startswith("| rag |"))
    assert rag.endswith("| 75.0 [75.0, 75.0] | – |")  # no top-1 column to fill
