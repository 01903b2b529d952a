"""EAGLE-3 heads in every dialect: they load with the layers their project means (against a from-scratch
reference on explicitly chosen HF hidden states, with a wrong-convention control), refuse what they
cannot honour in one line, export for each engine exactly as its loader reads, and round-trip."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3_engines import (
    QK_NORM,
    eagle_capture,
    eagle_load,
    reference_forward,
    sglang_capture,
    sglang_forward,
    sglang_load,
    sglang_params,
    vllm_capture,
    vllm_config,
    vllm_load,
    vllm_params,
    vllm_unloaded,
)
from eagle3_fixtures import (
    write_eagle_head,
    write_sglang_head,
    write_specforge_head,
    write_speculators_head,
    write_speculators_trained_head,
)
from specrank.cli import main
from specrank.decode.core import ModelLoadError, causal_mask
from specrank.decode.loading.drafters import load_drafter
from specrank.decode.loading.eagle3_export import DTYPES, FORMATS, ExportError, cast, export_head
from specrank.decode.loading.eagle3_formats import choose_layers, read_head, read_state
from specrank.decode.loading.targets import load_target
from specrank.testing import save_tiny_llama

torch.set_num_threads(1)
LAYERS = 8  # target depth: EAGLE-3's default states are hidden_states (2, 4, 5)
CONTEXT, ROOT = [4, 8, 15, 16, 23, 42, 7], 50


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("eagle3_formats")


@pytest.fixture(scope="module")
def target(tmp):
    return load_target(save_tiny_llama(tmp / "target", seed=4, num_layers=LAYERS))


def raw(directory):
    """The fixture's tensors under the canonical names (the test's own reading)."""
    state = read_state(directory)
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}


def specrank_root(drafter, target):
    """specrank's own pipeline: the target's states at the drafter's layers, then the root and one child."""
    n = len(CONTEXT)
    _, hidden = target.forward(torch.tensor(CONTEXT), torch.arange(n), causal_mask(n, 0), target.new_cache(),
                               drafter.hidden_layers)
    drafter.start(torch.tensor(CONTEXT), hidden)
    root = drafter._draft_root(ROOT)
    child = int(root.logp.argmax())
    token = drafter.draft_to_target[child]
    logp, _ = drafter._draft_step(token[None], torch.tensor([root.position + 1]), torch.zeros(1, root.visible + 1),
                                  root.feed[None])
    return root.logp, logp[0], int(token)


def residual_stream(target, post_norm=False):
    """HF ``hidden_states`` of CONTEXT, the last one taken before the final norm (the residual stream after
    the last layer, which vLLM and SGLang capture) unless ``post_norm`` (what HF returns)."""
    norm = target.model.model.norm
    if not post_norm:
        target.model.model.norm = torch.nn.Identity()
    try:
        return target.model(input_ids=torch.tensor(CONTEXT)[None], output_hidden_states=True).hidden_states
    finally:
        target.model.model.norm = norm


def reference_root(weights, flags, target, layers, child, post_norm=False, forward=reference_forward):
    """The reference ``forward`` on HF ``hidden_states`` at the explicitly chosen indices ``layers``."""
    states = residual_stream(target, post_norm)
    rows = torch.cat([states[i][0] for i in layers], -1)
    embed, cfg = weights.get("embed_tokens.weight", target.model.get_input_embeddings().weight), target.model.config
    tokens = CONTEXT[1:] + [ROOT]
    logits, fed = forward(weights, cfg, flags, embed, tokens, rows)
    logits_child, _ = forward(weights, cfg, flags, embed, tokens + [child], rows, fed[-1:])
    return torch.log_softmax(logits[-1], -1), torch.log_softmax(logits_child[-1], -1)


DIALECTS = [  # name, writer, kwargs, the layers the project means, a wrong convention's
    ("SafeAILab EAGLE", write_eagle_head, {}, (2, 4, 5), (3, 5, 6)),
    ("SpecForge/SGLang", write_specforge_head, {"ids": [1, 3, 4]}, (2, 4, 5), (1, 3, 4)),
    ("SpecForge/SGLang", write_specforge_head, {"ids": [0, 2, 5], "fc_norm": True}, (1, 3, 6), (0, 2, 5)),
    ("vLLM speculators", write_speculators_head, {"ids": [1, 3, 6]}, (1, 3, 6), (2, 4, 7)),
    # the end of the stack: id L (speculators' launch_vllm.py appends it), id L - 1 (SpecForge)
    ("vLLM speculators", write_speculators_head, {"ids": [2, 5, LAYERS]}, (2, 5, LAYERS), (2, 5, LAYERS - 1)),
    ("SpecForge/SGLang", write_specforge_head, {"ids": [1, 4, LAYERS - 1]}, (2, 5, LAYERS), (2, 5, LAYERS - 1)),
    # speculators' trainer: EAGLE 3.1, several draft layers, Llama or Qwen3 ones
    ("vLLM speculators", write_speculators_trained_head, {"ids": [2, 5, LAYERS]}, (2, 5, LAYERS), (2, 5, LAYERS - 1)),
    ("vLLM speculators", write_speculators_trained_head, {"ids": [1, 3, 6], "num_layers": 1, "arch": "qwen3"},
     (1, 3, 6), (2, 4, 7)),
    ("vLLM speculators", write_speculators_trained_head, {"ids": [2, 4, 5], "num_layers": 3, "arch": "qwen3"},
     (2, 4, 5), (3, 5, 6)),
]


@pytest.mark.parametrize("name, writer, kwargs, intended, wrong", DIALECTS)
def test_dialects_draft_from_the_layers_their_project_means(target, tmp, capsys, name, writer, kwargs, intended, wrong):
    directory = tmp / f"{writer.__name__}-{'-'.join(map(str, intended))}-{kwargs.get('arch', '')}"
    flags = writer(directory, target.model.config, **kwargs)
    drafter = load_drafter(f"eagle3:{directory}", target)
    message = capsys.readouterr().err
    assert name in message and str(list(intended)) in message and drafter.hidden_layers == intended
    weights = raw(directory)
    assert drafter.draft_to_target.tolist() == weights["t2d"].nonzero().flatten().tolist()
    root, child, token = specrank_root(drafter, target)
    ref_root, ref_child = reference_root(weights, flags, target, intended, token)
    torch.testing.assert_close(root, ref_root, atol=2e-4, rtol=0)
    torch.testing.assert_close(child, ref_child, atol=2e-4, rtol=0)
    wrong_root, _ = reference_root(weights, flags, target, wrong, token)
    assert (root - wrong_root).abs().max() > 1e-2  # negative control: the other convention drafts otherwise
    for control in ({"layers": 1} if flags.get("layers", 1) > 1 else {}, {"qk_norm": False} if flags.get("qk_norm") else {}):
        if control:  # the extra draft layers, Qwen3's q_norm / k_norm: each changes the draft
            other_root, _ = reference_root(weights, {**flags, **control}, target, intended, token)
            assert (root - other_root).abs().max() > 1e-2, control
    if LAYERS in intended:  # HF's hidden_states[L] is after the final norm: not what the engines feed
        normed_root, _ = reference_root(weights, flags, target, intended, token, post_norm=True)
        assert (root.exp() - normed_root.exp()).abs().max() > 1e-2


def test_an_eagle_deepspeed_file_ignores_the_target_buffers_only(target, tmp, capsys):
    directory = tmp / "eagle-deepspeed"
    write_eagle_head(directory, target.model.config)
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    assert sum(k.startswith("target_model.") for k in state) == LAYERS  # as save_16bit_model keeps them
    load_drafter(f"eagle3:{directory}", target)
    assert f"{LAYERS} target_model.* buffers ignored" in capsys.readouterr().err
    state["midlayer.self_attn.extra_proj.weight"] = torch.zeros(4, 4).half()  # a head weight nobody reads
    torch.save(state, directory / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"unexpected \['midlayer.self_attn.extra_proj.weight'\]"):
        load_drafter(f"eagle3:{directory}", target)


def test_eagle3_layers_override_and_where_it_applies(target, tmp, capsys):
    directory = tmp / "eagle-override"
    write_eagle_head(directory, target.model.config)
    drafter = load_drafter(f"eagle3:{directory}", target, eagle3_layers=(1, 2, 3))
    assert drafter.hidden_layers == (1, 2, 3) and drafter.spec.endswith("--eagle3-layers 1,2,3")
    assert "--eagle3-layers" in capsys.readouterr().err
    with pytest.raises(ModelLoadError, match="applies to eagle3"):
        load_drafter("early-exit:2", target, eagle3_layers=(1, 2, 3))
    with pytest.raises(ModelLoadError, match=r"0\.\.8"):
        load_drafter(f"eagle3:{directory}", target, eagle3_layers=(1, 2, 9))
    capsys.readouterr()
    assert main(["decode", "--drafter", f"eagle3:{directory}", "--out", str(tmp / "x"), "--eagle3-layers", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--eagle3-layers" in err[0] and not (tmp / "x").exists()


def test_a_config_must_read_as_the_layers_its_training_names(target, tmp):
    directory = tmp / "layers-and-training"
    write_specforge_head(directory, target.model.config, ids=[1, 3, 6])
    (directory / "training.json").write_text(json.dumps({"params": {"gen_layers": [2, 4, 7]}}))
    head = read_head(directory)
    assert (head.dialect, head.layers) == ("sglang", (2, 4, 7))
    for trained in ([1, 3, 6], [5, 5, 5]):  # ids written as the layers themselves (an older layout), or others
        (directory / "training.json").write_text(json.dumps({"params": {"gen_layers": trained}}))
        with pytest.raises(ModelLoadError, match="disagree .* re-export"):
            read_head(directory)


def _edit(field, value):
    def edit(cfg):
        if value is None:
            cfg.pop(field)
        elif "." in field:
            outer, inner = field.split(".")
            cfg[outer] = {**(cfg.get(outer) or {}), inner: value}
        else:
            cfg[field] = value
    return edit


REFUSED = [  # writer, edit, the field the error names
    (write_specforge_head, _edit("norm_before_residual", True), "norm_before_residual"),
    (write_specforge_head, _edit("mystery_flag", True), "mystery_flag"),
    (write_eagle_head, _edit("num_hidden_layers", 2), "num_hidden_layers"),
    (write_sglang_head, _edit("bias", True), "bias"),
    (write_specforge_head, _edit("bias", True), "bias"),
    (write_specforge_head, _edit("eagle_config.use_aux_hidden_state", False), "use_aux_hidden_state"),
    (write_specforge_head, _edit("eagle_config.eagle_aux_hidden_state_layer_ids", [1, 2]),
     "eagle_aux_hidden_state_layer_ids"),
    (write_specforge_head, _edit("norm_output", "yes"), "norm_output"),
    (write_specforge_head, _edit("use_sliding_window", True), "use_sliding_window"),
    (write_specforge_head, _edit("tie_word_embeddings", True), "tie_word_embeddings"),
    (write_specforge_head, _edit("attention_bias", True), "attention_bias"),
    (write_eagle_head, _edit("some_new_field", 1), "some_new_field"),
    (write_eagle_head, _edit("draft_vocab_size", None), "draft_vocab_size"),
    (write_speculators_head, _edit("fc_norm", True), "fc_norm"),
    (write_speculators_head, _edit("transformer_layer_config.tie_word_embeddings", True), "tie_word_embeddings"),
    (write_speculators_head, _edit("speculators_model_type", "mtp"), "speculators_model_type"),
    (write_speculators_head, _edit("transformer_layer_config.secret", 3), "secret"),
]


@pytest.mark.parametrize("writer, edit, field", REFUSED)
def test_unsupported_or_unknown_fields_fail_in_one_line_naming_them(target, tmp, writer, edit, field):
    directory = tmp / f"refused-{writer.__name__}-{field}"
    writer(directory, target.model.config)
    cfg = json.loads((directory / "config.json").read_text())
    edit(cfg)
    (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as err:
        load_drafter(f"eagle3:{directory}", target)
    assert f"'{field}'" in str(err.value) and "\n" not in str(err.value)


def test_the_export_command_refuses_in_one_line_and_writes_nothing(target, tmp, capsys):
    src = tmp / "to-refuse"
    write_speculators_head(src, target.model.config, ids=[1, 3, 6])
    out = tmp / "refused-out"
    assert main(["drafter", "export", str(src), "--format", "sglang", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "norm_before_fc" in err and "\n" not in err and not out.exists()
    assert main(["drafter", "export", str(src), "--format", "eagle", "--out", str(out)]) == 2
    assert not out.exists() and not list(tmp.glob(".refused-out*"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_export_then_reload_is_identity(target, tmp, fmt, dtype, capsys):
    src = tmp / "export-src"
    if not src.exists():
        write_specforge_head(src, target.model.config, ids=[1, 3, 4])
    out, _ = export_head(src, tmp / f"export-{fmt}-{dtype}", fmt, dtype)
    before, after = read_head(src), read_head(out)
    assert after.dialect == {"sglang": "sglang", "vllm": "speculators", "eagle": "eagle"}[fmt]
    assert choose_layers(after, LAYERS)[0] == choose_layers(before, LAYERS)[0] == (2, 4, 5)
    assert set(after.state) == set(before.state)
    for k, v in cast(before.state, DTYPES[dtype]).items():
        assert after.state[k].dtype == v.dtype and torch.equal(after.state[k], v), k
    reloaded = load_drafter(f"eagle3:{out}", target)
    assert reloaded.hidden_layers == (2, 4, 5)
    if dtype == "bf16":  # the source is bf16: drafting is unchanged
        original = load_drafter(f"eagle3:{src}", target)
        assert torch.equal(specrank_root(reloaded, target)[0], specrank_root(original, target)[0])


def test_flags_and_layer_ids_round_trip_where_the_engine_has_them(target, tmp):
    specforge, speculators = tmp / "rt-specforge", tmp / "rt-speculators"
    write_specforge_head(specforge, target.model.config, ids=[2, 3, 4], fc_norm=True)
    write_speculators_head(speculators, target.model.config, ids=[1, 3, 6])
    for src, flags in ((specforge, ("fc_norm",)), (speculators, ("norm_before_residual", "norm_before_fc",
                                                                 "feedback_post_norm"))):
        before = read_head(src)
        after = read_head(export_head(src, tmp / f"{src.name}-vllm", "vllm")[0])
        assert after.layers == before.layers and all(after.config[f] for f in flags)
        with pytest.raises(ExportError, match="cannot export to eagle"):
            export_head(src, tmp / f"{src.name}-eagle", "eagle")


SGLANG_CASES = [  # hidden_states the head drafts from, convention asked, ids written (None: refused)
    ((2, 4, 5), "current", [1, 3, 4]), ((2, 4, 5), "legacy", [1, 3, 4]),  # both conventions read these alike
    ((2, 5, LAYERS), "current", [1, 4, LAYERS - 1]),
    ((3, 4, 5), "current", [3, 4, 5]), ((3, 4, 5), "legacy", [2, 3, 4]),
    ((1, 3, 6), "current", None), ((1, 3, 6), "legacy", [0, 2, 5]),  # current shifts a first id of 1
    ((0, 3, 6), "current", [0, 3, 6]), ((0, 3, 6), "legacy", None),  # legacy cannot name the embeddings
]


@pytest.mark.parametrize("layers, convention, ids", SGLANG_CASES)
def test_sglang_export_names_the_same_layers_under_the_rule_it_states(target, tmp, capsys, layers, convention, ids):
    src = tmp / f"sglang-convention-src-{'-'.join(map(str, layers))}"
    if not src.exists():
        write_specforge_head(src, target.model.config, ids=[i - 1 for i in layers] if layers[0] else [0, 2, 5])
        if not layers[0]:  # a SpecForge id cannot name the embeddings: state the layers as speculators would
            cfg = json.loads((src / "config.json").read_text())
            cfg["eagle_config"]["layer_id_convention"] = "current"
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(layers)
            (src / "config.json").write_text(json.dumps(cfg))
    assert read_head(src).layers == layers
    out = tmp / f"sglang-convention-{'-'.join(map(str, layers))}-{convention}"
    code = main(["drafter", "export", str(src), "--format", "sglang", "--sglang-convention", convention, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    if ids is None:
        assert code == 2 and len(err) == 1 and f"{convention} convention" in err[0] and not out.exists()
        return
    cfg = json.loads((out / "config.json").read_text())
    written = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert code == 0 and written == ids and len(err) == 1 and "SGLang layer ids" in err[0]
    readings = {r: sglang_capture(written, LAYERS, after_pr_25454=r == "current") for r in ("current", "legacy")}
    assert readings[convention] == layers and read_head(out).layers == layers
    if readings["current"] == readings["legacy"]:
        assert "before and after PR #25454" in err[0] and "layer_id_convention" not in cfg["eagle_config"]
    else:  # the file says which SGLang it is for, and the other reading is really different
        other = "legacy" if convention == "current" else "current"
        assert f"{convention} convention" in err[0] and readings[other] != layers
        assert cfg["eagle_config"]["layer_id_convention"] == convention


@pytest.fixture(scope="module")
def trained_head(target, tmp):
    """What ``specrank drafter train`` saves: ``new_head`` + ``save_head`` at the default layers."""
    from specrank.drafter_training.head import new_head, save_head
    from specrank.drafter_training.vocab import most_frequent

    vocab = most_frequent(torch.arange(128) % 50, target.vocab_size, 40)
    directory = save_head(tmp / "trained", new_head(target, vocab, seed=3), vocab, (2, 4, 5))
    return directory, vocab


SGLANG_FIELDS = {"architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                 "vocab_size", "hidden_act", "num_hidden_layers", "draft_vocab_size", "tie_word_embeddings",
                 "torch_dtype", "eagle_config"}
SPECULATORS_FIELDS = {"architectures", "speculators_model_type", "speculators_version", "speculators_config",
                      "transformer_layer_config", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                      "norm_before_fc", "fc_norm", "norm_output", "eagle_aux_hidden_state_layer_ids", "torch_dtype"}
EAGLE_FIELDS = {"architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size",
                "hidden_act", "num_hidden_layers", "draft_vocab_size", "tie_word_embeddings", "torch_dtype"}


def test_the_trained_head_saves_in_the_sglang_layout(trained_head):
    directory, _ = trained_head
    cfg = json.loads((directory / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and set(cfg) == SGLANG_FIELDS
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_trained_head_exported_has_exactly_what_the_engine_reads(trained_head, tmp, fmt):
    directory, vocab = trained_head
    out, _ = export_head(directory, tmp / f"engine-{fmt}", fmt, "bf16")
    cfg = json.loads((out / "config.json").read_text())
    if fmt == "sglang":
        state = load_file(str(out / "model.safetensors"))
        loaded, skipped, hot = sglang_load(cfg, state)
        assert set(cfg) == SGLANG_FIELDS and not skipped
        assert loaded == sglang_params(cfg) - {"model.embed_tokens.weight"} and torch.equal(hot, vocab.ids)
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert sglang_capture(ids, LAYERS, False) == sglang_capture(ids, LAYERS, True) == (2, 4, 5)
    elif fmt == "vllm":
        state = load_file(str(out / "model.safetensors"))
        hf = vllm_config(cfg)
        assert set(cfg) == SPECULATORS_FIELDS and hf["norm_before_residual"] is False
        assert vllm_load(hf, state) == vllm_params(hf) - {"model.embed_tokens.weight"}
        assert vllm_capture(hf, LAYERS) == (2, 4, 5)
        assert torch.equal(state["d2t"] + torch.arange(len(vocab.ids)), vocab.ids)
    else:
        state = torch.load(out / "pytorch_model.bin", weights_only=True)
        missing, unexpected = eagle_load(cfg, state)
        assert set(cfg) == EAGLE_FIELDS and "target_hidden_size" not in cfg  # else cnets.py skips the embedding
        assert missing == ["embed_tokens.weight"] and not unexpected and eagle_capture(LAYERS) == (2, 4, 5)
        assert state["fc.weight"].shape == (cfg["hidden_size"], 3 * cfg["hidden_size"])


def test_decode_takes_eagle3_layers_as_part_of_the_run(target, tmp, capsys):
    head = tmp / "eagle-cli"
    write_eagle_head(head, target.model.config)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 0, "category": "qa", "turns": ["the cat is big"]}) + "\n")
    args = ["decode", "--target", str(tmp / "target"), "--drafter", f"eagle3:{head}", "--prompts", str(prompts),
            "--topk", "3", "--depth", "2", "--expand", "2", "--budget", "4", "--extra", "2", "--max-new-tokens", "4",
            "--threads", "1", "--no-progress", "--no-tracking", "--out", str(tmp / "cli-run")]
    assert main(args + ["--eagle3-layers", "1,2,3"]) == 0
    manifest = json.loads((tmp / "cli-run" / "manifest.json").read_text())
    assert manifest["drafter"].endswith("--eagle3-layers 1,2,3")
    assert main(args + ["--eagle3-layers", "1,2,4"]) == 2 and "different run" in capsys.readouterr().err
    fp16 = [a if a != str(tmp / "cli-run") else str(tmp / "cli-run-fp16") for a in args]
    assert main(fp16 + ["--dtype", "float16"]) == 0  # EAGLE trains in fp16; V100 and T4 run nothing else
    manifest = json.loads((tmp / "cli-run-fp16" / "manifest.json").read_text())
    assert manifest["dtype"] == "float16" and list((tmp / "cli-run-fp16" / "rounds").iterdir())


def test_fc_bias_and_a_tied_lm_head_load_and_export_as_sglang_reads_them(target, tmp, capsys):
    from safetensors.torch import save_file

    directory = tmp / "sglang-bias-tied"
    write_specforge_head(directory, target.model.config, draft_vocab=target.vocab_size, ids=[1, 3, 4])
    state = load_file(str(directory / "model.safetensors"))
    state.pop("lm_head.weight")
    state["fc.bias"] = torch.randn(target.hidden_size).bfloat16()
    save_file(state, str(directory / "model.safetensors"))
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "bias": True, "tie_word_embeddings": True}))
    drafter = load_drafter(f"eagle3:{directory}", target)
    assert drafter.head.lm_head.weight is target.model.get_input_embeddings().weight
    torch.testing.assert_close(drafter.head.fc.bias, state["fc.bias"].float())
    out, _ = export_head(directory, tmp / "sglang-bias-tied-out", "sglang")
    written = json.loads((out / "config.json").read_text())
    assert written["bias"] is True and written["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    loaded, skipped, _ = sglang_load(written, load_file(str(out / "model.safetensors")))
    assert not skipped and loaded == sglang_params(written) - {"model.embed_tokens.weight"}
    with pytest.raises(ExportError, match="fc_bias"):
        export_head(directory, tmp / "sglang-bias-tied-vllm", "vllm")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_multi_layer_heads_export_for_vllm_and_are_refused_where_one_layer_is_built(target, tmp, arch):
    src = tmp / f"multi-{arch}"
    write_speculators_trained_head(src, target.model.config, ids=[2, 5, LAYERS], num_layers=2, arch=arch)
    out, _ = export_head(src, tmp / f"multi-{arch}-vllm", "vllm", "bf16")
    cfg = json.loads((out / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"]) == (arch, 2)
    state = load_file(str(out / "model.safetensors"))
    assert {k.split(".")[1] for k in state if k.startswith("layers.")} == {"0", "1"}
    hf = vllm_config(cfg)  # Eagle3LlamaForCausalLM / Eagle3Qwen3ForCausalLM load every tensor into a parameter
    assert hf["architectures"] == [{"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}[arch]]
    assert vllm_unloaded(hf, vllm_load(hf, state)) == ({"model.layers.1.hidden_norm.weight"} if arch == "qwen3" else set())
    assert vllm_capture(hf, LAYERS) == (2, 5, LAYERS)
    reloaded, original = load_drafter(f"eagle3:{out}", target), load_drafter(f"eagle3:{src}", target)
    assert len(reloaded.head.layers) == 1 and reloaded.head.config.draft_layer_type == arch
    assert torch.equal(specrank_root(reloaded, target)[1], specrank_root(original, target)[1])
    for fmt in ("sglang", "eagle"):
        with pytest.raises(ExportError, match="2 draft layers") as err:
            export_head(src, tmp / f"multi-{arch}-{fmt}", fmt)  # SGLang stacks other layers: a different network
        assert ("additional_layers" in str(err.value) and "residual" in str(err.value)) == (fmt == "sglang")


def test_fields_of_specforge_published_configs_that_nobody_reads_load_unchanged(target, tmp):
    """SpecForge's ``configs/qwen3-30B-A3B-eagle3.json`` and friends (a6b6b023) carry Qwen fields that neither
    SpecForge nor SGLang's ``llama_eagle3.py`` reads: the head loads and drafts as without them."""
    plain, extra = tmp / "specforge-plain", tmp / "specforge-qwen-fields"
    for directory in (plain, extra):
        write_specforge_head(directory, target.model.config)
    cfg = json.loads((extra / "config.json").read_text())
    cfg.update(decoder_sparse_step=1, target_model_type="qwen3_moe", max_window_layers=48, sliding_window=None,
               use_sliding_window=False)
    (extra / "config.json").write_text(json.dumps(cfg))
    a, b = load_drafter(f"eagle3:{plain}", target), load_drafter(f"eagle3:{extra}", target)
    assert torch.equal(specrank_root(a, target)[1], specrank_root(b, target)[1])


def owns_aligned_weights(drafter) -> bool:
    """Every parameter the head owns (not the target's shared embedding) starts 64-byte aligned: an fp32 file's
    tensors, views of its buffer at 8-byte offsets, were copied."""
    own = [p for n, p in drafter.head.named_parameters() if not n.startswith("embed_tokens.")]
    return all(p.data_ptr() % 64 == 0 for p in own)


def sglang_steps(drafter, target):
    """specrank's pipeline two draft steps deep: the root row, its argmax child, that child's argmax child
    (each step reads the draft KV cache of the ones before) -> (log-probs (3, Vd), the two tokens)."""
    n = len(CONTEXT)
    _, hidden = target.forward(torch.tensor(CONTEXT), torch.arange(n), causal_mask(n, 0), target.new_cache(),
                               drafter.hidden_layers)
    drafter.start(torch.tensor(CONTEXT), hidden)
    root = drafter._draft_root(ROOT)
    rows, feed, tokens = [root.logp], root.feed[None], []
    for depth in (1, 2):
        tokens.append(int(drafter.draft_to_target[int(rows[-1].argmax())]))
        logp, feed = drafter._draft_step(torch.tensor(tokens[-1:]), torch.tensor([root.position + depth]),
                                         torch.zeros(1, root.visible + depth), feed)
        rows.append(logp[0])
    return torch.stack(rows), tokens


def sglang_reference_steps(weights, flags, target, tokens):
    """``sglang_forward`` uncached on ``hidden_states`` (2, 4, 5) (SGLang ids [1, 3, 4] + 1): the root row, then
    each child on its parent's fed-back state."""
    states = residual_stream(target)
    rows = torch.cat([states[i][0] for i in (2, 4, 5)], -1)
    embed, cfg, seq = target.model.get_input_embeddings().weight, target.model.config, CONTEXT[1:] + [ROOT]
    logits, fed = sglang_forward(weights, cfg, flags, embed, seq, rows)
    out, own = [logits[-1]], fed[-1:]
    for token in tokens:
        seq = seq + [token]
        logits, fed = sglang_forward(weights, cfg, flags, embed, seq, rows, own)
        out, own = out + [logits[-1]], torch.cat([own, fed[-1:]])
    return torch.log_softmax(torch.stack(out), -1)


@pytest.mark.parametrize("num_layers", [2, 3])
def test_sglang_heads_of_several_layers_draft_as_sglang_stacks_them(target, tmp, capsys, num_layers):
    """SGLang's ``llama_eagle3.py`` (03d5a777) stacks ``additional_layers`` that read the previous layer's MLP
    output without its residual stream: the root and two draft steps match its forward re-implemented, and
    neither the speculators stacking of the same tensors nor one layer fewer does."""
    directory = tmp / f"sglang-{num_layers}-layers"
    flags = write_sglang_head(directory, target.model.config, num_layers=num_layers, ids=[1, 3, 4])
    drafter = load_drafter(f"eagle3:{directory}", target)
    assert "SpecForge/SGLang" in capsys.readouterr().err and drafter.hidden_layers == (2, 4, 5)
    assert len(drafter.head.additional_layers) == num_layers - 1 and not len(drafter.head.layers)
    weights = raw(directory)
    rows, tokens = sglang_steps(drafter, target)
    torch.testing.assert_close(rows, sglang_reference_steps(weights, flags, target, tokens), atol=2e-4, rtol=0)
    for control in ({"drop_residual": False}, {"layers": num_layers - 1}):
        other = sglang_reference_steps(weights, {**flags, **control}, target, tokens)
        assert (rows - other).abs().max() > 1e-2, control  # negative controls: each drafts otherwise
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "bias": True}))
    with pytest.raises(ModelLoadError, match="additional layers' attention biases"):
        load_drafter(f"eagle3:{directory}", target)


def test_sglang_stacked_heads_export_as_sglang_loads_them_and_nowhere_else(target, tmp):
    src = tmp / "sglang-3-export"
    write_sglang_head(src, target.model.config, num_layers=3, ids=[1, 3, 4])
    out, _ = export_head(src, tmp / "sglang-3-export-sglang", "sglang", "fp32")
    cfg, state = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    assert cfg["num_hidden_layers"] == 3 and set(cfg) == SGLANG_FIELDS
    loaded, skipped, hot = sglang_load(cfg, state)  # every tensor a parameter, every parameter whole
    assert not skipped and loaded == sglang_params(cfg) - {"model.embed_tokens.weight"}
    source = load_file(str(src / "model.safetensors"))
    assert set(state) == set(source) and all(torch.equal(state[k], source[k].float()) for k in source)
    assert torch.equal(hot, torch.arange(len(source["d2t"])) + source["d2t"])
    h = target.hidden_size  # the additional layers' q/k/v read H, the midlayer's 2H
    assert state["additional_layers.1.self_attn.q_proj.weight"].shape[1] == h
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    renamed = {k.replace("additional_layers.1.", "layers.2."): v for k, v in state.items()}  # control
    loaded_renamed, skipped_renamed, _ = sglang_load(cfg, renamed)
    assert skipped_renamed and loaded_renamed != loaded
    partial = {k: v for k, v in state.items() if k != "additional_layers.0.self_attn.k_proj.weight"}
    assert "model.additional_layers.0.self_attn.qkv_proj.weight" not in sglang_load(cfg, partial)[0]
    reloaded, original = load_drafter(f"eagle3:{out}", target), load_drafter(f"eagle3:{src}", target)
    assert owns_aligned_weights(reloaded)
    assert torch.equal(sglang_steps(reloaded, target)[0], sglang_steps(original, target)[0])
    for fmt, reason in (("vllm", "additional_layers"), ("eagle", "3 draft layers")):
        with pytest.raises(ExportError, match=reason) as err:
            export_head(src, tmp / f"sglang-3-export-{fmt}", fmt)
        assert f"cannot export to {fmt}" in str(err.value) and "\n" not in str(err.value)
        assert not (tmp / f"sglang-3-export-{fmt}").exists()


@pytest.mark.parametrize("num_layers", [1, 2])
def test_qwen3_heads_reach_vllm_with_every_q_and_k_norm(target, tmp, num_layers):
    """Export -> vLLM's ``Eagle3Qwen3ForCausalLM`` loader -> the head's layers, each with its own q_norm and
    k_norm; dropping or misnaming one is caught (vLLM itself would load the former silently)."""
    src = tmp / f"qwen3-{num_layers}"
    write_speculators_trained_head(src, target.model.config, ids=[1, 3, 6], num_layers=num_layers, arch="qwen3")
    out, _ = export_head(src, tmp / f"qwen3-{num_layers}-vllm", "vllm", "fp32")
    hf, state = vllm_config(json.loads((out / "config.json").read_text())), load_file(str(out / "model.safetensors"))
    norms = {f"model.layers.{i}.{n}" for i in range(num_layers) for n in QK_NORM}
    loaded = vllm_load(hf, state)
    assert hf["architectures"] == ["Eagle3Qwen3ForCausalLM"] and norms <= loaded
    assert vllm_unloaded(hf, loaded) == {f"model.layers.{i}.hidden_norm.weight" for i in range(1, num_layers)}
    source = load_file(str(src / "model.safetensors"))
    for name in norms:  # the very weights: vLLM's name back to the checkpoint's
        key = name.removeprefix("model.")
        assert torch.equal(state[key], source[key].float())
    dropped = {k: v for k, v in state.items() if k != f"layers.{num_layers - 1}.self_attn.k_norm.weight"}
    assert vllm_unloaded(hf, vllm_load(hf, dropped)) != vllm_unloaded(hf, loaded)  # the control: a norm left out
    misnamed = {k.replace("layers.0.self_attn.q_norm", "layers.0.self_attn.query_norm"): v for k, v in state.items()}
    with pytest.raises(KeyError, match="query_norm"):
        vllm_load(hf, misnamed)


NORM_OUTPUT = [  # the config's norm_output, the convention asked, what the head does (specrank's flags)
    (None, None, {}), (None, "before-pr879", {}),  # absent: plain EAGLE-3 under both
    (True, None, {"feedback_post_norm": True}), (True, "after-pr879", {"feedback_post_norm": True}),
    (True, "before-pr879", {}),
    (False, "after-pr879", {}), (False, "before-pr879", {"logits_from_norm": False}),
]


@pytest.mark.parametrize("value, convention, meaning", NORM_OUTPUT)
def test_specforge_norm_output_before_and_after_pr879(target, tmp, capsys, value, convention, meaning):
    directory = tmp / f"norm-output-{value}"
    if not directory.exists():
        write_specforge_head(directory, target.model.config, ids=[1, 3, 4])
        cfg = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**cfg, **({} if value is None else {"norm_output": value})}))
    capsys.readouterr()
    drafter = load_drafter(f"eagle3:{directory}", target, specforge_norm_output=convention)
    assert ("after PR #879" in capsys.readouterr().err) == (value is not None and convention is None)
    root, child, token = specrank_root(drafter, target)
    weights = raw(directory)
    ref_root, ref_child = reference_root(weights, meaning, target, (2, 4, 5), token)
    torch.testing.assert_close(root, ref_root, atol=2e-4, rtol=0)
    torch.testing.assert_close(child, ref_child, atol=2e-4, rtol=0)
    for other in ({}, {"feedback_post_norm": True}, {"logits_from_norm": False}):
        if other != meaning:  # control: each other reading drafts otherwise
            other_root, other_child = reference_root(weights, other, target, (2, 4, 5), token)
            assert max((root - other_root).abs().max(), (child - other_child).abs().max()) > 1e-2, other
