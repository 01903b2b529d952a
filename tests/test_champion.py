"""The study's champion: chosen by its cross-fitted gain at the study's budgets, ties to the simpler reranker, and
refused on the prompts it learned from."""

import pytest

from specrank.decode.loading.drafters import SeenPromptError
from specrank.decode.prompts import Prompt
from specrank.workflow.champion import DEPLOYABLE, check_unseen_prompts, choose_champion, model_card


def figures(gains: dict[str, tuple[float, float]]) -> dict:
    """Study figures with each score's gain % over draft at B = 8 and 59."""
    def scores(j):
        return {r: {"mean": [1.0, 0.9, 1.1], "gain": [g[j] / 100, 0, 0], "gain_pct": [g[j], g[j] - 1, g[j] + 1],
                    "root_share": [10.0, 5.0, 15.0]} for r, g in gains.items()}
    return {"rounds": 100, "budgets": {"8": {"scores": scores(0)}, "59": {"scores": scores(1)}}}


def test_the_best_mean_gain_over_the_budgets_wins():
    choice = choose_champion(figures({"isotonic": (1, 1), "rows": (10, 4), "rows+per_depth": (12, 3)}))
    assert choice["reranker"] == "rows+per_depth" and choice["mean_gain_pct"] == pytest.approx(7.5)
    assert choice["by_budget"] == {"8": "rows+per_depth", "59": "rows"}  # the budgets disagree: the mean decides


def test_the_top1_choice_is_reported_but_does_not_vote():
    f = figures({"rows": (10, 4), "ranking": (6, 2)})
    top1 = {r: {**e, "gain_pct": [g, g - 1, g + 1]} for (r, e), g in zip(f["budgets"]["8"]["scores"].items(), (1, 90))}
    f["budgets"] = {"1": {"scores": top1}, **f["budgets"]}
    choice = choose_champion(f)
    assert choice["reranker"] == "rows" and choice["mean_gain_pct"] == pytest.approx(7)  # B = 1's 90% left out
    assert choice["by_budget"] == {"1": "ranking", "8": "rows", "59": "rows"}


def test_a_tie_goes_to_the_simpler_reranker():
    choice = choose_champion(figures({"rows+per_depth": (5, 5), "rows": (5, 5), "base": (4, 6)}))
    assert choice["reranker"] == "base"  # equal means: base is simpler than rows and rows + per-depth
    assert DEPLOYABLE.index("base") < DEPLOYABLE.index("rows") < DEPLOYABLE.index("rows+per_depth")


def test_reference_scores_are_never_champions():
    choice = choose_champion(figures({"rows": (2, 2), "root": (50, 50), "oracle": (90, 90)}))
    assert choice["reranker"] == "rows"
    with pytest.raises(ValueError, match="no deployable reranker"):
        choose_champion(figures({"root": (50, 50)}))


def test_a_budget_without_a_defined_gain_does_not_vote():
    nan = float("nan")
    choice = choose_champion(figures({"base": (nan, 1), "rows": (nan, 3)}))
    assert choice["reranker"] == "rows" and choice["mean_gain_pct"] == pytest.approx(3)
    assert choice["by_budget"] == {"8": "base", "59": "rows"}  # no gain at B = 8: the simplest stands
    nowhere = choose_champion(figures({"base": (nan, nan), "rows": (nan, nan)}))
    assert nowhere["reranker"] == "base"


class Card:
    pass


def test_a_champion_is_refused_on_its_training_prompts_and_counted_when_allowed():
    seen = [Prompt("a", "qa", "the cat is big"), Prompt("b", "qa", "the dog is small")]
    other = [Prompt("c", "qa", "where is the sun")]
    model = Card()
    model.card_ = model_card("rows", {"mean_gain_pct": 1.0, "by_budget": {"8": "rows"}}, figures({"rows": (1, 1)}), seen,
                             data="p.jsonl", command="specrank study", temperature=1.0)
    assert check_unseen_prompts(model, other) == 0
    with pytest.raises(SeenPromptError, match="learned from 1 of these 2 prompts"):
        check_unseen_prompts(model, [other[0], Prompt("x", "qa", "the dog is small")], source="champ")
    assert check_unseen_prompts(model, seen, allow=True) == 2
    assert check_unseen_prompts(Card(), seen) == 0  # no card: nothing known, nothing refused
