"""docs/python-api.md's research workflow, run as written on tiny random models: the page's loaders and bundled
prompts are swapped for a tiny target, a tiny drafter and a few short prompts; every line of the block runs."""

import re
from pathlib import Path

from decode_helpers import saved_tiny_inputs

PAGE = Path(__file__).parents[1] / "docs" / "python-api.md"
TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is"]


def section_code(title: str) -> str:
    """The Python code blocks of the page's section ``title``, joined."""
    section = PAGE.read_text(encoding="utf-8").split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, f"no code in section {title!r}"
    return "\n".join(blocks)


def test_the_research_workflow_block_runs_to_a_table_and_a_saved_reranker(tmp_path, monkeypatch, capsys):
    import specrank.decode.loading as loading
    import specrank.decode.loading.model_spec as model_spec
    import specrank.workflow.recording as recording_module
    from specrank.decode import Decoder

    tgt, drf, prompts = saved_tiny_inputs(tmp_path, TEXTS)
    load_target, load_drafter = loading.load_target, loading.load_drafter
    monkeypatch.setattr(model_spec, "load_target", lambda spec, *a, **k: load_target(str(tgt)))
    monkeypatch.setattr(model_spec, "load_drafter", lambda spec, target, *a, **k: load_drafter(f"standalone:{drf}",
                                                                                                target))
    monkeypatch.setattr(recording_module, "default_prompts_path", lambda: prompts)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(section_code("The research workflow"), str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    table = capsys.readouterr().out
    assert "| Score |" in table and "rows" in table
    assert namespace["recording"].path == Path("runs/t1") and (tmp_path / "runs/t1/evaluation/report.md").is_file()
    assert set(namespace["rerankers"].models("rows")) == {0, 1}
    target, drafter = namespace["models"].load()
    dec = Decoder(target, drafter, "reranked", reranker="runs/t1/rows", budget=8)
    assert dec.generate("the cat is big", max_new_tokens=4, temperature=1).stats.rounds >= 1

