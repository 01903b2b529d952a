"""docs/your-own-pair.md's Python block, run as written on tiny random pairs of two architectures (Qwen3 and
Gemma 3, both with sliding windows): the page's target directory and head are swapped for a saved tiny target
and a tiny EAGLE-3 head, the study's sizes for tiny ones and the bundled Spec-Bench prompts for a short file;
every line of the block runs to a finished study."""

import json
import re
from pathlib import Path

import pytest

from specrank.testing import save_tiny_eagle3, tiny_causal_lm, tiny_tokenizer

PAGE = Path(__file__).parents[1] / "docs" / "your-own-pair.md"
TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is", "give me five red stars", "where is the river",
         "we eat fish and drink water", "a new house in the city"]
TINY = dict(rounds=40, greedy_rounds=30, max_new_tokens=10, chunk=4, bootstrap=20, tune_trials=0, n_estimators=20,
            online_prompts=3, online_other_prompts=2, online_budgets=(8,))


def python_block() -> str:
    section = PAGE.read_text(encoding="utf-8").split("\n## In Python\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_the_python_block_studies_a_pair_of_its_own(arch, tmp_path, monkeypatch, capsys):
    from dataclasses import replace

    import specrank.experiments.study as experiment

    target = tmp_path / "target"
    model = tiny_causal_lm(arch, seed=0)
    model.save_pretrained(target)
    tiny_tokenizer(128).save_pretrained(target)
    head = save_tiny_eagle3(tmp_path / "head", model.config, seed=0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(TEXTS)))
    block = python_block()
    target_spec, drafter_spec = re.search(r'ModelSpec\("([^"]+)",\s*#[^\n]*\n\s*"([^"]+)"', block).groups()
    paths = {target_spec: str(target), drafter_spec: f"eagle3:{head}"}
    study = experiment.study

    def tiny_study(models, settings, **kwargs):
        models = replace(models, target=paths[models.target], drafter=paths[models.drafter], threads=1)
        settings = replace(settings, **TINY, prompts=str(prompts))
        return study(models, settings, **{**kwargs, "progress": False, "tracking": None})

    monkeypatch.setattr(experiment, "study", tiny_study)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    result = namespace["result"]
    printed = capsys.readouterr().out
    assert result.path == (tmp_path / "runs/qwen3-pair").resolve() and (result.path / "results.md").is_file()
    assert "Rows share of root's gain" in printed and str(result.path / "results.md") in printed
    assert set(result.results["temperatures"]) == {"1", "0"}
