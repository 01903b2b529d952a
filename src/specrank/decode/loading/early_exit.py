"""Early-exit self-drafter: the target's first K layers, an optional linear exit head, then the
target's final norm and lm head. Weights are shared with the target (no copy); the drafter
keeps its own KV cache for its K layers.

The exit head maps the layer-K hidden state h_K to an estimate of the target's last hidden
state direction: it is fitted by ridge regression of ``h_L / rms(h_L)`` (h_L: the input of
the final norm) on ``[h_K, 1]`` over text, skipping each window's first position (SmolLM2's
middle layers carry outliers there). The final norm is scale-invariant, so only the
direction matters.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.utils import logging as hf_logging

from specrank.atomic import atomic_write
from specrank.decode.core import ModelLoadError, parse_device
from specrank.decode.loading.standalone import CausalLMDrafter
from specrank.decode.loading.target_spec import check_target_spec, target_config
from specrank.decode.loading.targets import load_target, parse_dtype, target_tokenizer
from specrank.decode.loading.weight_files import weight_files
from specrank.outputs import check_distinct, check_output_file
from specrank.errors import first_line
from specrank.files import sha256_files


class ExitHeadError(ModelLoadError):
    """An exit head file is missing, malformed or made for another target."""


def truncated_lm(model, layers: int, exit_head: nn.Module | None = None):
    """A causal LM running ``model``'s first ``layers`` layers (shared weights), the exit head, norm and lm head."""
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ModelLoadError("early-exit drafter needs a Llama-style target (model.layers, model.norm)")
    if not 1 <= layers <= len(inner.layers):
        raise ModelLoadError(f"early-exit layers must be in 1..{len(inner.layers)}, got {layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):
        lm = type(model)(config)
    lm.model.embed_tokens, lm.model.rotary_emb = inner.embed_tokens, inner.rotary_emb
    lm.model.layers = nn.ModuleList(inner.layers[:layers])
    lm.model.norm = inner.norm if exit_head is None else nn.Sequential(exit_head, inner.norm)
    lm.lm_head = model.get_output_embeddings()
    return lm.eval()


def new_exit_head(hidden_size: int) -> nn.Linear:
    """An identity-initialised linear exit head (H -> H, with bias)."""
    head = nn.Linear(hidden_size, hidden_size)
    with torch.no_grad():
        head.weight.copy_(torch.eye(hidden_size))
        head.bias.zero_()
    return head.requires_grad_(False)


def save_exit_head(path, head: nn.Linear, layers: int, target) -> Path:
    """Write the head as safetensors (``weight``, ``bias``; metadata: layers, target hash), atomically."""
    from safetensors.torch import save_file

    tensors = {"weight": head.weight.detach().float().cpu().contiguous(), "bias": head.bias.detach().float().cpu()}
    metadata = {"layers": str(layers), "target_sha256": target.source_hash}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def check_exit_head_file(path) -> dict:
    """The metadata of the exit head file ``path``, refused unless it is a safetensors file with
    ``weight`` and ``bias`` (only its header is read)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"exit head not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
    except (SafetensorError, OSError) as exc:
        raise ExitHeadError(f"exit head {path}: not a safetensors file ({first_line(exc)})") from None
    if not {"weight", "bias"} <= keys:
        raise ExitHeadError(f"exit head {path}: holds {sorted(keys)[:4]}, expected weight and bias")
    return meta


def load_exit_head(path, target, layers: int) -> nn.Linear:
    """Read an exit head for ``target`` at ``layers`` layers (refused if made for other ones)."""
    from safetensors import safe_open

    meta = check_exit_head_file(path)
    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        weight, bias = f.get_tensor("weight"), f.get_tensor("bias")
    if meta.get("layers") != str(layers):
        raise ExitHeadError(f"exit head {path.name} was fitted at {meta.get('layers')} layers, not {layers}")
    if weight.shape != (target.hidden_size, target.hidden_size) or bias.shape != (target.hidden_size,):
        raise ExitHeadError(
            f"exit head {path.name} has shape {tuple(weight.shape)}, target hidden size is {target.hidden_size}"
        )
    head = new_exit_head(target.hidden_size)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    return head.to(target.device, target.dtype)


@torch.inference_mode()
def exit_regression_data(target, layers: int, windows) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``X = h_K`` and ``Y = h_L / rms(h_L)``, (N, H) float64, over token windows minus their first positions."""
    final = {}
    hook = target.model.model.norm.register_forward_pre_hook(lambda mod, args: final.update(h=args[0]))
    xs, ys = [], []
    try:
        for ids in windows:
            ids = torch.as_tensor(ids, dtype=torch.long, device=target.device)[None]
            out = target.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            xs.append(out.hidden_states[layers][0, 1:].double())
            ys.append(final["h"][0, 1:].double())
    finally:
        hook.remove()
    x, y = torch.cat(xs), torch.cat(ys)
    return x.cpu(), (y * y.pow(2).mean(-1, keepdim=True).rsqrt()).cpu()


def fit_exit_head(target, layers: int, windows, ridge: float = 1e-3) -> nn.Linear:
    """Fit the exit head on token windows by ridge regression (see ``solve_exit_head``)."""
    return solve_exit_head(target, *exit_regression_data(target, layers, windows), ridge=ridge)


def solve_exit_head(target, x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3) -> nn.Linear:
    """Ridge regression of ``y`` on ``[x, 1]`` (float64 normal equations; the bias is not penalised)."""
    if len(x) < 2:
        raise ValueError("fit-exit-head: need at least two positions of text beyond each window's first")
    xa = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)  # (N, H+1)
    penalty = torch.eye(xa.shape[1], dtype=x.dtype) * ridge * len(x)
    penalty[-1, -1] = 0.0
    coef = torch.linalg.solve(xa.T @ xa + penalty, xa.T @ y)  # (H+1, H)
    head = new_exit_head(target.hidden_size)
    with torch.no_grad():
        head.weight.copy_(coef[:-1].T)
        head.bias.copy_(coef[-1])
    return head.to(target.device, target.dtype)


@torch.inference_mode()
def exit_agreement(target, head: nn.Module | None, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> float:
    """Share of rows where norm+lm_head of the (head-mapped) layer-K state has the target's argmax."""
    norm, lm_head = target.model.model.norm, target.model.get_output_embeddings()
    dev, dt = target.device, target.dtype
    hits = 0
    for start in range(0, len(x), chunk):
        xs, ys = x[start : start + chunk].to(dev, dt), y[start : start + chunk].to(dev, dt)
        draft = lm_head(norm(xs if head is None else head(xs))).argmax(-1)
        hits += int((draft == lm_head(norm(ys)).argmax(-1)).sum())
    return hits / max(len(x), 1)


def text_windows(tokenizer, files, window: int, max_tokens: int) -> list[list[int]]:
    """Token windows of ``window`` ids over the concatenated files, at most ``max_tokens`` ids in all."""
    if window < 2 or max_tokens < 2:
        raise ValueError("--window and --max-tokens must be at least 2")
    ids: list[int] = []
    for path in files:
        ids += tokenizer(path.read_text(), add_special_tokens=False)["input_ids"]
    ids = ids[:max_tokens]
    windows = [ids[i : i + window] for i in range(0, len(ids), window)]
    return [w for w in windows if len(w) >= 2]


@dataclass(frozen=True)
class ExitHeadFit:
    """Positions an exit head was fitted on and, when some windows were held out, the target's top-1 agreement
    there without the head and with it."""

    positions: int
    held_positions: int = 0
    agreement_before: float = float("nan")
    agreement_after: float = float("nan")


def fit_exit_head_on_text(target_spec, layers: int, text_files, out, *, window: int = 256,
                          max_tokens: int = 20_000, holdout: float = 0.1, ridge: float = 1e-3, device: str = "cpu",
                          dtype: str = "float32", graphs: bool | None = None) -> ExitHeadFit:
    """Fit the linear exit head of an early-exit drafter at ``layers`` on plain-text files and save it to ``out``
    (``specrank drafter fit-exit-head``); every input is checked, in one line naming its option, before the
    target loads."""
    text_files = [Path(p) for p in text_files]
    missing = [str(p) for p in text_files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"--text: text file not found: {missing[0]}")
    check_output_file(out)
    parse_device(device)
    parse_dtype(dtype)
    path = check_target_spec(target_spec)
    weights = weight_files(path) if path is not None and path.is_dir() else []
    check_distinct({"--out": out}, {**{f"--text {p}": p for p in text_files},
                                   **{f"target weights {p.name}": p for p in weights}})
    hf_logging.disable_progress_bar()  # a refusal below is the only line on stderr
    num_layers = target_config(target_spec)["num_hidden_layers"]
    if not 1 <= layers < num_layers:
        raise ValueError(f"--layers must be in 1..{num_layers - 1} (the target has {num_layers}), got {layers}")
    windows = text_windows(target_tokenizer(target_spec), text_files, window, max_tokens)
    n_held = int(round(len(windows) * holdout)) if len(windows) > 1 else 0
    if len(windows) - n_held < 1:
        raise ValueError(f"--text: not enough text: need at least one window of 2 tokens to fit on "
                         f"({', '.join(str(p) for p in text_files)})")
    target = load_target(target_spec, device, dtype, graphs)
    x, y = exit_regression_data(target, layers, windows[: len(windows) - n_held])
    head = solve_exit_head(target, x, y, ridge)
    save_exit_head(out, head, layers, target)
    if not n_held:
        return ExitHeadFit(len(x))
    hx, hy = exit_regression_data(target, layers, windows[len(windows) - n_held :])
    return ExitHeadFit(len(x), len(hx), exit_agreement(target, None, hx, hy), exit_agreement(target, head, hx, hy))


class EarlyExitDrafter(CausalLMDrafter):
    """The target's first K layers drafting with their own KV cache."""

    def __init__(self, target, layers: int, exit_head: nn.Module | None = None, head_path=None, spec: str = ""):
        lm = truncated_lm(target.model, layers, exit_head)
        super().__init__(lm, target.vocab_size, spec or f"early-exit:{layers}")
        self.target, self.layers, self.head_path = target, layers, head_path

    @functools.cached_property
    def source_hash(self) -> str:
        """The target's hash, plus the exit head file's when there is one."""
        if self.head_path is None:
            return self.target.source_hash
        return f"{self.target.source_hash}+{sha256_files([self.head_path])}"


def load_early_exit(target, layers: int, head_path=None, spec: str = "") -> EarlyExitDrafter:
    """An early-exit drafter at ``layers`` layers, with the exit head at ``head_path`` if given."""
    head = None if head_path is None else load_exit_head(head_path, target, layers)
    return EarlyExitDrafter(target, layers, head, head_path, spec)
