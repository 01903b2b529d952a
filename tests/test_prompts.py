import json
from collections import Counter

import pytest

from specrank.decode.prompts import PromptError, default_prompts_path, encode_prompt, read_prompts


def _write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bundled_set_has_eight_prompts_per_task():
    prompts = read_prompts(default_prompts_path())
    counts = Counter(p.task for p in prompts)
    assert len(counts) == 7 and set(counts.values()) == {8}
    assert {"writing", "translation", "summarization", "qa", "math_reasoning", "rag", "code"} == set(counts)
    assert all(len(p.text) > 30 for p in prompts)
    # Tasks alternate, so `--limit N` (the demo's subset) covers every task once N >= 7.
    assert len({p.task for p in prompts[:7]}) == 7


def test_specbench_and_humaneval_forms(tmp_path):
    path = _write(tmp_path, [
        json.dumps({"question_id": 81, "category": "writing", "turns": ["first", "second"]}),
        json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}),
    ])
    a, b = read_prompts(path)
    assert (a.prompt_id, a.task, a.text) == ("81", "writing", "first")
    assert (b.prompt_id, b.task, b.text) == ("HumanEval/0", "code", "def f():\n")
    assert len(read_prompts(path, limit=1)) == 1


@pytest.mark.parametrize("lines, match", [
    (['{"question_id": 1, "turns": ["a"]}', '{"question_id": 2, "turns": ['], "line 2: malformed JSON"),
    (['{"foo": 1}'], "line 1: neither"),
    (['{"question_id": 1, "turns": []}'], "line 1: 'turns'"),
    (['{"question_id": 1, "turns": ["a"]}', '{"question_id": 1, "turns": ["b"]}'], "duplicate prompt id"),
    (["", "  "], "no prompts"),
])
def test_bad_files_name_the_problem(tmp_path, lines, match):
    with pytest.raises(PromptError, match=match):
        read_prompts(_write(tmp_path, lines))


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="not found"):
        read_prompts("/nonexistent/prompts.jsonl")


class _ChatTok:
    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert messages == [{"role": "user", "content": "hi"}] and add_generation_prompt and tokenize
        return [5, 6, 7]


class _PlainTok:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [1, 2, 3, 4][: len(text)]}


def test_encode_uses_one_user_turn_or_plain_text():
    assert encode_prompt(_ChatTok(), "hi") == [5, 6, 7]
    assert encode_prompt(_PlainTok(), "abc") == [1, 2, 3]
    with pytest.raises(PromptError, match="at least 2"):
        encode_prompt(_PlainTok(), "a")
