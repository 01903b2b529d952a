"""The study's champion: the deployable reranker with the best cross-fitted value at the study's budgets, refitted on
every round of one temperature and saved as one reranker with its model card.

Choice. Each deployable reranker is judged by its gain over draft selection in % of draft's value (the cross-fitted
offline figure), averaged over the study's tree budgets, so that each budget weighs the same on a relative scale (the
top-1 choice, B = 1, is a chain's choice, not a tree's: its winner is recorded, it does not vote); when
the budgets' own winners disagree, that mean decides (both winners are recorded). A tie (equal means to 1e-9) goes
to the simpler reranker, in the order of ``DEPLOYABLE``: fewer fitted parts, fewer features. A budget where the
gain is undefined (draft selection's value is zero there, as on a drafter that is never accepted) does not vote; with
none defined, the simplest reranker is the champion.

Refusal. The card lists the sha256 of every prompt the champion learned from; ``check_unseen_prompts`` refuses to
measure it on any of them (its acceptance there is inflated), as a drafter's head is refused on its training
prompts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrank.decode.prompts import prompt_digest
from specrank.decode.loading.drafters import SeenPromptError
from specrank.evaluation.names import of_kind
from specrank.featurize.storage import edges_run
from specrank.rerankers import StackedReranker
from specrank.workflow.rerankers import refit

DEPLOYABLE = of_kind("control", "reranker", "stacked")  # simplest first, as registered: a tie goes left
TIE = 1e-9


def choose_champion(figures: dict, rerankers=DEPLOYABLE) -> dict:
    """``{"reranker", "mean_gain_pct", "by_budget"}``: the reranker of ``rerankers`` with the highest mean over the budgets of
    ``figures["budgets"][b]["scores"][name]["gain_pct"]`` (a temperature's study figures), its mean, and each
    budget's own winner."""
    budgets = [b for b in figures["budgets"] if int(b) > 1] or list(figures["budgets"])
    present = [r for r in rerankers if all(r in figures["budgets"][b]["scores"] for b in budgets)]
    if not present:
        raise ValueError(f"no deployable reranker among the study's figures (looked for {', '.join(rerankers)})")

    def gain(name, b):
        return float(figures["budgets"][b]["scores"][name]["gain_pct"][0])

    means = {r: float(np.nanmean(g)) if np.isfinite(g := [gain(r, b) for b in budgets]).any() else float("nan")
             for r in present}
    name = simplest_best(present, means)
    by_budget = {b: simplest_best(present, {r: gain(r, b) for r in present}) for b in figures["budgets"]}
    return {"reranker": name, "mean_gain_pct": means[name], "by_budget": by_budget}


def simplest_best(names: list[str], values: dict[str, float]) -> str:
    """The first of ``names`` whose value is the highest finite one to ``TIE``; the first name if none is finite."""
    finite = [values[n] for n in names if np.isfinite(values[n])]
    if not finite:
        return names[0]
    best = max(finite)
    return next(n for n in names if values[n] >= best - TIE)


def fit_champion(name: str, run_dir: Path, features, *, tune_trials: int, seed: int, n_jobs: int | None,
                 gbm: dict | None = None):
    """The reranker ``name`` (one of ``DEPLOYABLE``) fitted on every round of ``run_dir``: its first factor on ``features`` (the
    run's features table), per-depth calibration on the run's pool edges; tuned as the study tunes its folds."""
    first, _, deeper = name.partition("+")
    needs_edges = "per_depth" in (first, deeper)
    edges = edges_run(run_dir) if needs_edges else None
    if first == "per_depth":
        return refit("per_depth", features, edges, tune_trials=tune_trials, seed=seed, n_jobs=n_jobs, gbm=gbm)
    model = refit(first, features, edges, tune_trials=tune_trials, seed=seed, n_jobs=n_jobs, gbm=gbm)
    if not deeper:
        return model
    per_depth = refit("per_depth", features, edges, tune_trials=0, seed=seed, n_jobs=n_jobs, gbm=gbm)
    return StackedReranker.from_fitted(model, per_depth)


def model_card(name: str, choice: dict, figures: dict, prompts, *, data: str, command: str, temperature: float) -> dict:
    """The champion's card: what it is, what it learned from (the prompts' sha256), how it was chosen and its
    cross-fitted figures at each budget."""
    return {
        "reranker": name,
        "temperature": float(temperature),
        "data": data,
        "rounds": int(figures["rounds"]),
        "prompts": len(prompts),
        "command": command,
        "chosen_by": "mean over budgets of the cross-fitted gain over draft, % of draft's value; ties to the simpler reranker",
        "mean_gain_pct": choice["mean_gain_pct"],
        "by_budget": choice["by_budget"],
        "figures": {b: {k: f["scores"][name][k] for k in ("mean", "gain", "gain_pct", "root_share")}
                    for b, f in figures["budgets"].items()},
        "training_prompts": sorted({prompt_digest(p.text) for p in prompts}),
    }


def training_prompts(reranker) -> set[str]:
    """The sha256 of every prompt ``reranker`` learned from, by its model card (empty: no card)."""
    card = getattr(reranker, "card_", None) or {}
    return set(card.get("training_prompts", ()))


def check_unseen_prompts(reranker, prompts, allow: bool = False, source: str = "",
                         flag: str = "--allow-training-prompts") -> int:
    """Refuse (``SeenPromptError``) to measure ``reranker`` on prompts it learned from, unless ``allow``; return
    how many of ``prompts`` it learned from."""
    seen_digests = training_prompts(reranker)
    seen = [p.prompt_id for p in prompts if prompt_digest(p.text) in seen_digests]
    if seen and not allow:
        where = f"reranker {source}".strip()
        raise SeenPromptError(f"{where} learned from {len(seen)} of these {len(prompts)} prompts (e.g. {seen[0]!r}): "
                              f"its gain there is inflated; decode other prompts, or pass {flag} to measure it anyway")
    return len(seen)
