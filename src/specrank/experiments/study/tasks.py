"""The study's per-task table: each task's rounds with Rows - Base and every reranker's share of root selection's
gain, at the top-1 choice and at B = 8, with paired prompt-bootstrap intervals.

Spec-Bench's tasks differ in what a retained row can know: a summarization or RAG prompt contains much of its
continuation, so the token-keyed and same-token rows of its tokens exist before they are drafted, where a writing
prompt's continuation is new text. The table says whether the rerankers' gain follows.

A task's intervals come from the study's own resamples (``PromptBootstrap.split``): each resample draws prompts over
all tasks and keeps a task's rounds, so a task's figures and the whole study's share their draws.
"""

from __future__ import annotations

import numpy as np

from specrank.evaluation.names import full_label, rerankers
from specrank.markdown import interval_cell
from specrank.selection.stats import PromptBootstrap

TASK_BUDGETS = (1, 8)  # the top-1 choice a chain makes, and the tree budget the study's online goal reads


def task_figures(boot: PromptBootstrap, task: np.ndarray, prompt_id: np.ndarray, values: dict[str, np.ndarray],
                 budgets, at=TASK_BUDGETS) -> dict:
    """{task: {"rounds", "prompts", "budgets": {b: {"root_gain_pct", "rows_minus_base_pct_of_draft",
    "root_share": {reranker: [point, low, high]}}}}} from ``values`` (score -> (N, len(budgets))) of the rounds
    whose tasks are ``task`` (N,) and prompts ``prompt_id`` (N,), at the budgets ``at``."""
    at = [b for b in at if b in budgets]
    columns = {f"{name}@{b}": v[:, list(budgets).index(b)] for name, v in values.items() for b in at}
    learned = rerankers(values)
    out = {}
    for name, totals in boot.split(columns, task).items():
        entry = {"rounds": int(np.sum(task == name)), "prompts": int(len(np.unique(prompt_id[task == name]))),
                 "budgets": {}}
        for b in at:
            draft, root = f"draft@{b}", f"root@{b}"
            figures = {"root_gain_pct": list(map(float, totals.gain_pct(root, draft))),
                       "root_share": {r: list(map(float, totals.share(f"{r}@{b}", draft, root))) for r in learned}}
            if "rows" in values and "base" in values:
                figures["rows_minus_base_pct_of_draft"] = list(map(float, 
                    totals.ratio([(f"rows@{b}", 1), (f"base@{b}", -1)], [(draft, 1)], 100.0)))
            entry["budgets"][str(b)] = figures
        out[str(name)] = entry
    return out


def task_section(tasks: dict, champion: str) -> list[str]:
    """The per-task Markdown table of one temperature: Rows - Base at B = 8, and the ``champion``'s share of root's
    gain at B = 8 and at the top-1 choice."""
    lines = [f"### By task (champion: {full_label(champion)})", "",
             "| Task | rounds | prompts | root's gain, % of draft (B = 8) | Rows − Base, % of draft (B = 8) [95% CI] "
             "| champion's share of root's gain, B = 8 [95% CI] | at the top-1 choice [95% CI] |",
             "|---|---|---|---|---|---|---|"]
    for name, entry in tasks.items():
        cells = []
        b8, b1 = entry["budgets"].get("8", {}), entry["budgets"].get("1", {})
        cells.append(f"{b8['root_gain_pct'][0]:.1f}" if b8 else "–")
        cells.append(interval_cell(b8["rows_minus_base_pct_of_draft"]) if "rows_minus_base_pct_of_draft" in b8 else "–")
        for b in (b8, b1):
            share = b.get("root_share", {}).get(champion)
            cells.append(interval_cell(share, 1, sign=False) if share else "–")
        lines.append(f"| {name} | {entry['rounds']} | {entry['prompts']} | " + " | ".join(cells) + " |")
    return lines
