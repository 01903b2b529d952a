"""``specrank study`` end to end on tiny models: resumable to the same results, refusing seen prompts, and the
shipped head and prompt sets it relies on."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specrank.cli import main
from specrank.decode.prompts import default_prompts_path, prompt_digest, read_prompts, spec_bench_path
from specrank.testing import save_tiny_llama

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("study")

WORDS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is", "the dog can run fast", "is the moon cold",
         "give me five red stars", "where is the river", "we eat fish and drink water", "a new house in the city",
         "who has the blue car", "the fire is hot"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("study")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = d / "prompts.jsonl"
    tasks = ["qa", "writing"]
    context = json.loads((tgt / "config.json").read_text())["max_position_embeddings"]
    texts = WORDS[:5] + [" ".join(["the cat"] * context)] + WORDS[5:]  # one prompt too long for the context
    ids = [f"p{i:02d}" for i in range(len(WORDS))]
    ids = ids[:5] + ["long"] + ids[5:]
    prompts.write_text("".join(json.dumps({"question_id": q, "category": tasks[i % 2], "turns": [t]}) + "\n"
                               for i, (q, t) in enumerate(zip(ids, texts))))
    return d, tgt, drf, prompts


def study_args(models, out, *extra):
    d, tgt, drf, prompts = models
    return ["study", "--out", str(out), "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts",
            str(prompts), "--rounds", "90", "--greedy-rounds", "60", "--max-new-tokens", "12", "--chunk", "4",
            "--bootstrap", "40", "--tune-trials", "0", "--n-estimators", "40", "--online-other-prompts", "2",
            "--threads", "1", "--no-tracking", *extra]


def comparable(path: Path) -> dict:
    """The results JSON without what differs between two runs of one study: its wall times, its command line and
    the online phase's measured speeds and costs (its accepted tokens stay)."""
    results = json.loads(path.read_text())
    for r in results["temperatures"].values():
        for f in r.get("online", {}).get("budgets", {}).values():
            f.pop("break_even")
            for e in f["strategies"].values():
                e.pop("speed")
    return {k: v for k, v in results.items() if k not in ("timing", "command")}


def offline_page(page: str) -> str:
    """The results page without its "Offline vs online" section, whose speeds are measured."""
    head, found, rest = page.partition("## Offline vs online")
    return head + (rest[rest.index("\n## "):] if found and "\n## " in rest else "")


@pytest.fixture(scope="module")
def reference(models):
    out = models[0] / "reference"
    assert main(study_args(models, out)) == 0
    return out


def test_study_writes_every_figure(reference):
    results = json.loads((reference / "results.json").read_text())
    assert set(results["temperatures"]) == {"1", "0"}
    for t, goal in (("1", 90), ("0", 60)):
        r = results["temperatures"][t]
        assert r["rounds"] >= goal or r["prompts_decoded"] == len(WORDS)  # stopped at the first chunk past the goal
        assert r["prompts_decoded"] % 4 == 0  # whole shards
        assert list(r["budgets"]) == ["1", "8", "59"]  # the top-1 choice beside the trees
        for b in ("1", "8", "59"):
            f = r["budgets"][b]
            assert set(f["scores"]) >= {"draft", "isotonic", "per_depth", "base", "rows", "ranking", "rows+per_depth",
                                       "ranking+per_depth", "root", "oracle"}
            for score, entry in f["scores"].items():
                if score not in ("draft", "root"):
                    low, high = entry["root_share"][1:]
                    assert low <= entry["root_share"][0] <= high or low != low  # NaN when root gains nothing
            assert len(f["rows_minus_base"]["gain_pct_of_draft"]) == 3
        assert [p["fraction"] for p in r["learning_curve"]] == [0.25, 0.5, 1.0]
        rounds = [p["training_rounds"] for p in r["learning_curve"]]
        assert rounds == sorted(rounds) and rounds[0] < rounds[-1]
        assert set(r["first_factor"]) == {"draft", "isotonic", "per_depth", "base", "rows", "ranking"}
        assert r["tasks"] and all(set(e["budgets"]) == {"1", "8"} for e in r["tasks"].values())
        assert sum(e["rounds"] for e in r["tasks"].values()) == r["rounds"]
    page = (reference / "results.md").read_text()
    assert "Rows − Base" in page and "arXiv 2610.29210" in page and "### By task" in page
    assert (reference / "learning-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_study_saves_a_champion_and_decodes_unseen_prompts_online(reference):
    from specrank.decode.prompts import prompt_digest
    from specrank.rerankers import load_reranker
    from specrank.workflow.champion import DEPLOYABLE, check_unseen_prompts

    results = json.loads((reference / "results.json").read_text())
    order = read_prompts(reference / "prompts.jsonl")
    reserved = results["settings"]["online_prompts"]
    assert reserved == len(WORDS) // 4  # a quarter of the prompts at most
    for t, name in (("1", "t1"), ("0", "greedy")):
        r = results["temperatures"][t]
        assert r["champion"]["reranker"] in DEPLOYABLE and set(r["champion"]["by_budget"]) == {"1", "8", "59"}
        champion = load_reranker(reference / r["champion"]["path"])
        recorded = order[: r["prompts_decoded"]]
        assert set(champion.card_["training_prompts"]) == {prompt_digest(p.text) for p in recorded}
        assert champion.card_["rounds"] == r["rounds"] and champion.label_kind_ == (
            "probability" if t == "1" else "argmax")
        unseen = order[-reserved:]
        assert r["prompts_decoded"] <= len(order) - reserved  # the online prompts were never recorded
        assert check_unseen_prompts(champion, unseen) == 0
        with pytest.raises(ValueError, match="learned from"):
            check_unseen_prompts(champion, recorded[:2])
        online = r["online"]
        assert online["reranker"] == r["champion"]["reranker"] and set(online["budgets"]) == {"8", "59"}
        goal_cell = t == "1"  # the first sampled temperature's B = 8 decodes every reserved prompt, the others 2
        assert [online["budgets"][b]["prompts"] for b in ("8", "59")] == [reserved if goal_cell else 2, 2]
        for b, f in online["budgets"].items():
            assert set(f["strategies"]) == {"draft", "reranked", "root", "root_draw"}
            assert f["strategies"]["draft"]["speed"][0] == 1.0
            assert len(f["strategies"]["reranked"]["realized_gain"]) == 3
            assert f["offline"]["reranked"] == r["budgets"][b]["scores"][online["reranker"]]  # the same score offline
            assert f["break_even"]["round_ms"] == 14.5 and f["break_even"]["gain"] >= 0
    page = (reference / "results.md").read_text()
    assert "## Offline vs online" in page and "Champion" in page and "Regime: draft selection accepts" in page


def test_a_study_killed_mid_decode_and_rerun_gives_the_same_results(models, reference):
    """Killed while it decodes its second temperature (the first one's folder copied from the reference, as a
    study that got that far leaves it: decoding the first again would only repeat the same stages)."""
    out = models[0] / "killed"
    out.mkdir()
    shutil.copy2(reference / "prompts.jsonl", out / "prompts.jsonl")
    shutil.copytree(reference / "t1", out / "t1")
    argv = study_args(models, out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1] / "src"),
                                                                        os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "specrank.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not list((out / "greedy" / "rounds").glob("shard-*")):
        time.sleep(0.05)
    assert proc.poll() is None, "the study ended before it could be killed mid-decode"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "results.json").exists()
    assert main(argv) == 0
    assert comparable(out / "results.json") == comparable(reference / "results.json")
    page = (out / "results.md").read_text().replace(str(out), str(reference))  # the command line names --out
    assert offline_page(page) == offline_page((reference / "results.md").read_text())


def test_rerunning_a_finished_study_redoes_no_stage(models, reference, capsys):
    assert main(study_args(models, reference)) == 0
    printed = capsys.readouterr().out
    assert "$ specrank decode" not in printed and "$ specrank train" not in printed
    assert printed.count("(skipped)") == 8  # featurize, train, evaluate, champion at both temperatures
    assert "online:" not in printed  # the online phase's saved tables are read back


def test_a_study_carried_without_its_recordings_gives_the_same_results(models, reference, capsys):
    """A study moved to another machine with its small files only (prompts, each temperature's figures, champion and
    online tables) records nothing again and writes the same results; other settings are refused."""
    out = models[0] / "carried"
    out.mkdir()
    shutil.copy2(reference / "prompts.jsonl", out / "prompts.jsonl")
    for name in ("t1", "greedy"):
        for part in ("champion", "online"):
            shutil.copytree(reference / name / part, out / name / part)
        shutil.copy2(reference / name / "figures.json", out / name / "figures.json")
    assert main(study_args(models, out)) == 0
    printed = capsys.readouterr().out
    assert "record:" not in printed and printed.count("its offline figures and champion are carried") == 2
    assert comparable(out / "results.json") == comparable(reference / "results.json")
    assert main(study_args(models, out, "--rounds", "91")) == 2  # the carried figures answer other settings
    assert "carried figures of other settings" in capsys.readouterr().err


def test_another_study_in_the_same_directory_is_refused(models, reference, capsys):
    assert main(study_args(models, reference, "--seed", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds another study" in err[0]


def test_prompts_too_long_for_the_context_are_skipped_and_counted(reference):
    results = json.loads((reference / "results.json").read_text())
    assert results["prompts"]["skipped_too_long"] == 1 and results["prompts"]["available"] == len(WORDS) + 1
    study_prompts = read_prompts(reference / "prompts.jsonl")
    assert len(study_prompts) == len(WORDS) and "long" not in {p.prompt_id for p in study_prompts}


# ----------------------------------------------------------------------------------------------------------
# Prompt sets


def test_spec_bench_is_bundled_whole_with_its_licence():
    prompts = read_prompts(spec_bench_path())
    assert len(prompts) == 480
    assert {p.task for p in prompts} >= {"translation", "summarization", "qa", "math_reasoning", "rag"}
    assert "Apache License" in (spec_bench_path().parent / "spec_bench.LICENSE").read_text()


def test_the_evaluation_prompt_sets_share_no_text():
    bundled = {prompt_digest(p.text) for p in read_prompts(default_prompts_path())}
    study = {prompt_digest(p.text) for p in read_prompts(spec_bench_path())}
    assert len(bundled) == 56 and len(study) == 480 and not bundled & study


# ----------------------------------------------------------------------------------------------------------
# A head is not evaluated on the prompts it trained on


@pytest.fixture(scope="module")
def seen_head(models):
    """A tiny EAGLE-3 head whose training.json says it trained on the first two study prompts."""
    from transformers import AutoConfig

    from specrank.testing import save_tiny_eagle3

    d, tgt, _, prompts = models
    head = save_tiny_eagle3(d / "head", AutoConfig.from_pretrained(tgt))
    trained = read_prompts(prompts)[:2]
    (head / "training.json").write_text(json.dumps({"training_prompts": {p.prompt_id: prompt_digest(p.text)
                                                                         for p in trained}}))
    return head, trained


def decode_args(models, head, out, *extra):
    d, tgt, _, prompts = models
    return ["decode", "--target", str(tgt), "--drafter", f"eagle3:{head}", "--prompts", str(prompts), "--limit", "3",
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--extra", "4", "--max-new-tokens", "4",
            "--no-progress", "--no-tracking", "--out", str(out), *extra]


def test_decoding_a_head_on_its_training_prompts_is_refused(models, seen_head, tmp_path, capsys):
    head, trained = seen_head
    assert main(decode_args(models, head, tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained on 2 of these 3 prompts" in err[0] and repr(trained[0].prompt_id) in err[0]
    assert "--allow-training-prompts" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run").exists()


def test_asked_explicitly_the_manifest_says_so(models, seen_head, tmp_path):
    head, _ = seen_head
    assert main(decode_args(models, head, tmp_path / "run", "--allow-training-prompts")) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["drafter_trained_prompts"] == 2


def test_a_study_refuses_a_head_on_its_training_prompts(models, seen_head, tmp_path, capsys):
    head, _ = seen_head
    argv = study_args(models, tmp_path / "s")
    argv[argv.index("--drafter") + 1] = f"eagle3:{head}"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained on 2 of these" in err[0]
    assert not (tmp_path / "s").exists()


def test_unseen_prompts_decode_with_no_record_in_the_manifest(models, seen_head, tmp_path):
    head, _ = seen_head
    d, tgt, _, prompts = models
    unseen = tmp_path / "unseen.jsonl"
    unseen.write_text("".join(prompts.read_text().splitlines(keepends=True)[2:]))
    argv = decode_args(models, head, tmp_path / "run")
    argv[argv.index("--prompts") + 1] = str(unseen)
    assert main(argv) == 0
    assert "drafter_trained_prompts" not in json.loads((tmp_path / "run" / "manifest.json").read_text())


def test_the_results_page_is_the_rendering_of_the_committed_json():
    from specrank.experiments.study.results_page import TITLE, render_results

    docs = Path(__file__).parents[1] / "docs"
    results = json.loads((docs / "results" / "study.json").read_text())
    assert (docs / "results.md").read_text(encoding="utf-8") == render_results(results, "results/learning-curve.png")
    assert (docs / "results" / "learning-curve.png").is_file()
    for study in sorted(docs.glob("results/*/study.json")):  # a second pair's, published with --pair
        pair, folder = study.parent.name, f"results/{study.parent.name}"
        page = render_results(json.loads(study.read_text()), f"{folder}/learning-curve.png",
                              f"{TITLE} on a second pair, {pair}")
        assert (docs / f"results-{pair}.md").read_text(encoding="utf-8") == page
        assert (study.parent / "learning-curve.png").is_file()


# ----------------------------------------------------------------------------------------------------------
# The shipped head


def test_the_shipped_head_is_eagle3_default_on_an_empty_cache(tmp_path, monkeypatch):
    from specrank.decode.loading.eagle3_formats import read_head
    from specrank.decode.loading.eagle3_named_heads import default_head_dir, shipped_head_dir

    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    assert default_head_dir() == shipped_head_dir()
    head = read_head(shipped_head_dir())
    record = json.loads((shipped_head_dir() / "training.json").read_text())
    assert head.config["vocab_size"] == 49152 and head.config["draft_vocab_size"] == record["params"]["draft_vocab_size"]
    weights = shipped_head_dir() / "model.safetensors"
    assert weights.stat().st_size < 16 * 2**20  # bf16
    (tmp_path / "drafters" / "smollm2-eagle3").mkdir(parents=True)
    (tmp_path / "drafters" / "smollm2-eagle3" / "config.json").write_text("{}")
    assert default_head_dir() == tmp_path / "drafters" / "smollm2-eagle3"  # a head trained into the cache wins


def test_the_second_pairs_head_ships_and_a_missing_one_names_its_make_target(tmp_path, monkeypatch):
    from specrank.decode.loading import eagle3_named_heads
    from specrank.decode.loading.drafters import parse_drafter_spec, trained_on
    from specrank.decode.loading.eagle3_formats import read_head

    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    shipped = eagle3_named_heads.shipped_head_dir("gemma3-270m")
    assert eagle3_named_heads.head_dir("gemma3-270m") == shipped  # an empty cache: the package's head
    head = read_head(shipped)
    assert head.config["vocab_size"] == 262144 and (shipped / "model.safetensors").stat().st_size <= 20 * 2**20
    record = json.loads((shipped / "training.json").read_text())
    spec = f"eagle3:{shipped}"
    assert trained_on(spec, read_prompts(spec_bench_path())) == [] and record["training_prompts"]
    assert parse_drafter_spec("eagle3:gemma3-270m") == ("eagle3", "gemma3-270m")
    monkeypatch.setattr(eagle3_named_heads, "shipped_head_dir", lambda name="default": tmp_path / "none")
    with pytest.raises(FileNotFoundError, match=r"no EAGLE-3 head eagle3:gemma3-270m .*run `make drafter-gemma3`"):
        parse_drafter_spec("eagle3:gemma3-270m")  # neither the cache nor the package holds it: one line


def test_the_shipped_head_never_trained_on_an_evaluation_prompt():
    from specrank.decode.loading.drafters import trained_on
    from specrank.decode.loading.eagle3_named_heads import shipped_head_dir
    from specrank.decode.prompts import drafter_prompts_path

    record = json.loads((shipped_head_dir() / "training.json").read_text())["training_prompts"]
    bank = {p.prompt_id: prompt_digest(p.text) for p in read_prompts(drafter_prompts_path())}
    assert len(record) > 400 and all(bank[pid] == digest for pid, digest in record.items())  # all training-only
    spec = f"eagle3:{shipped_head_dir()}"
    assert trained_on(spec, read_prompts(default_prompts_path())) == []
    assert trained_on(spec, read_prompts(spec_bench_path())) == []
    assert len(trained_on(spec, read_prompts(drafter_prompts_path()))) == len(record)  # the control: it sees its own


def test_decoding_calls_are_sized_by_the_rounds_recorded_so_far():
    from specrank.experiments.study.round_target import next_limit

    assert next_limit(0, 0, 10_000, 480, 120) == 24
    assert next_limit(24, 1_000, 10_000, 480, 120) == 144  # 216 more wanted, 120 at most a call
    assert next_limit(144, 6_000, 10_000, 480, 120) == 144 + 96  # 96 = 4000 / (6000 / 144), in whole shards
    assert next_limit(240, 9_990, 10_000, 480, 120) == 244  # at least one shard
    assert next_limit(476, 9_000, 10_000, 480, 120) == 480  # never past the prompts
    assert next_limit(0, 0, 100, 480, 4) == 4


# ----------------------------------------------------------------------------------------------------------
# The shipped champions


@pytest.mark.parametrize("law", ["sampling", "greedy"])
def test_the_shipped_champion_is_reranker_default_on_an_empty_cache(tmp_path, monkeypatch, law):
    from specrank.rerankers.defaults import default_reranker_dir, load_default_reranker, shipped_reranker_dir

    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    temperature = 1.0 if law == "sampling" else 0.0
    assert default_reranker_dir(temperature) == shipped_reranker_dir(law)
    champion = load_default_reranker(temperature)
    assert champion.label_kind_ == ("probability" if law == "sampling" else "argmax")
    assert champion.card_["temperature"] == temperature and champion.card_["data"] == "spec_bench.jsonl"
    assert shipped_reranker_dir(law).suffix == ".zip" and shipped_reranker_dir(law).stat().st_size <= 2**20  # 1 MB


@pytest.mark.parametrize("law", ["sampling", "greedy"])
def test_the_shipped_champion_never_learned_from_an_evaluation_prompt(law):
    from specrank.rerankers import load_reranker
    from specrank.rerankers.defaults import shipped_reranker_dir
    from specrank.workflow.champion import check_unseen_prompts, training_prompts
    from specrank.experiments.study.study_prompts import study_order, unseen_prompts

    champion = load_reranker(shipped_reranker_dir(law))
    learned = training_prompts(champion)
    order = study_order(read_prompts(spec_bench_path()), 0)  # the default study's (every prompt fits SmolLM2)
    online = unseen_prompts()  # the prompts the default study kept unseen for its online phase
    assert [p.prompt_id for p in online] == [p.prompt_id for p in order[-100:]]
    assert check_unseen_prompts(champion, read_prompts(default_prompts_path())) == 0  # the demo's and benchmarks'
    assert check_unseen_prompts(champion, online) == 0
    assert learned == {prompt_digest(p.text) for p in order[: len(learned)]}  # the control: it sees its own


def test_the_regression_check_finds_a_changed_round_and_a_changed_page(reference, tmp_path):
    """``scripts/compare_studies.py``: a study against an exact copy finds every table equal; against a copy with
    one recorded round's acceptance changed, or a score on its page, it names that table (the negative controls)."""
    import importlib.util
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("compare_studies", Path(__file__).parents[1] / "scripts" /
                                                  "compare_studies.py")
    compare_studies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_studies)
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    equal, differences = compare_studies.compare(reference, copy)
    assert differences == [] and equal >= 2 * 6  # per temperature: rounds, features, edges, predictions, evaluation
    shard = sorted((copy / "t1" / "rounds").glob("shard-*.parquet"))[0]
    table = pq.read_table(shard)
    accepted = table.column("accepted").to_numpy().copy()
    accepted[0] += 1
    pq.write_table(table.set_column(table.column_names.index("accepted"), "accepted",
                                    pa.array(accepted, table.schema.field("accepted").type)), shard)
    page = (copy / "results.md").read_text()
    (copy / "results.md").write_text(page.replace("| Base reranker | ", "| Base reranker | 9", 1))
    _, differences = compare_studies.compare(reference, copy)
    assert [d.split(":")[0] for d in differences] == ["t1/rounds", "results.md differs"]
    assert compare_studies.main([str(reference), str(copy)]) == 1
    assert compare_studies.main([str(reference), str(tmp_path / "nowhere")]) == 2
