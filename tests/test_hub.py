"""Hub ids (``--target ORG/NAME[@REVISION]``, ``eagle3:ORG/NAME[@REVISION]``) resolve offline from a hub cache
laid out as huggingface_hub lays it out (``models--ORG--NAME/refs/main`` + ``snapshots/<commit>/``), record
the commit they resolved to, and a missing id fails in one line naming it, before anything loads."""

import json
import shutil

import pytest
import torch

from eagle3_fixtures import write_specforge_head
from specrank.cli import main
from specrank.decode.loading.drafters import load_drafter
from specrank.decode.loading.hub import parse_hub_id
from specrank.decode.loading.targets import load_target
from specrank.testing import save_tiny_llama

torch.set_num_threads(1)
TARGET, HEAD = "tiny-org/tiny-llama", "tiny-org/tiny-llama-eagle3"
COMMITS = {TARGET: "a" * 40, HEAD: "b" * 40}


def cache_repo(cache, repo, commit, source, tag=None):
    """Put ``source``'s files where huggingface_hub keeps ``repo`` at ``commit`` (branch main, optional tag)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, root / "snapshots" / commit)
    (root / "refs").mkdir()
    for ref in ("main",) + ((tag,) if tag else ()):
        (root / "refs" / ref).write_text(commit)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    target = save_tiny_llama(tmp / "src-target", seed=4, num_layers=8)
    write_specforge_head(tmp / "src-head", load_target(target).model.config, ids=[1, 3, 4])
    cache_repo(tmp / "cache", TARGET, COMMITS[TARGET], target, tag="v1")
    cache_repo(tmp / "cache", HEAD, COMMITS[HEAD], tmp / "src-head")
    return tmp


@pytest.fixture
def offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


def test_what_is_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id("meta-llama/Llama-3.1-8B-Instruct") == ("meta-llama/Llama-3.1-8B-Instruct", None)
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_hub_id("org/name") is None  # a local path wins
    assert all(parse_hub_id(s) is None for s in ("/abs/path", "./org/x", "name", "a/b/c", "smollm2"))


@pytest.mark.parametrize("revision", ["", "@main", "@v1", "@" + "a" * 40])
def test_hub_ids_resolve_offline_to_the_snapshot_and_its_commit(offline, revision):
    target = load_target(TARGET + revision)
    assert target.path == offline / "cache" / "models--tiny-org--tiny-llama" / "snapshots" / COMMITS[TARGET]
    assert target.revision == COMMITS[TARGET] and target.name == TARGET + revision


def test_decode_with_hub_ids_records_their_commits(offline, capsys):
    prompts = offline / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "qa", "turns": ["the cat is big"]}) + "\n")
    out = offline / "run"
    args = ["decode", "--target", TARGET, "--drafter", f"eagle3:{HEAD}@main", "--prompts", str(prompts), "--topk", "3",
            "--depth", "2", "--expand", "2", "--budget", "4", "--extra", "2", "--max-new-tokens", "3", "--threads", "1",
            "--no-progress", "--no-tracking", "--out", str(out)]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["target"], manifest["target_revision"]) == (TARGET, COMMITS[TARGET])
    assert (manifest["drafter"], manifest["drafter_revision"]) == (f"eagle3:{HEAD}@main", COMMITS[HEAD])
    drafter = load_drafter(f"eagle3:{HEAD}", load_target(TARGET))
    assert drafter.hidden_layers == (2, 4, 5) and drafter.revision == COMMITS[HEAD]
    root = offline / "cache" / "models--tiny-org--tiny-llama"  # main moves to a new commit: another run
    shutil.copytree(root / "snapshots" / COMMITS[TARGET], root / "snapshots" / ("c" * 40))
    (root / "refs" / "main").write_text("c" * 40)
    try:
        capsys.readouterr()
        assert main(args) == 2 and "different run" in capsys.readouterr().err
    finally:
        (root / "refs" / "main").write_text(COMMITS[TARGET])


@pytest.mark.parametrize("target, drafter, named", [
    ("tiny-org/missing", f"eagle3:{HEAD}", "tiny-org/missing"),
    (f"{TARGET}@v9", f"eagle3:{HEAD}", f"{TARGET}@v9"),
    (TARGET, "eagle3:tiny-org/no-head", "tiny-org/no-head"),
])
def test_a_missing_hub_id_fails_in_one_line_naming_it(offline, capsys, target, drafter, named):
    out = offline / "missing-run"
    code = main(["decode", "--target", target, "--drafter", drafter, "--out", str(out), "--no-tracking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0] and "local Hugging Face cache" in err[0]
    assert not out.exists()


def test_an_unreachable_hub_falls_back_to_the_cache(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: no network
    assert load_target(TARGET).revision == COMMITS[TARGET]
    with pytest.raises(FileNotFoundError, match="tiny-org/missing.*hub or its local cache"):
        load_target("tiny-org/missing")
