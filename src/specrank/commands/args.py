"""Argument types shared by the commands: argparse refuses an out-of-range value in one line, before any work."""

from __future__ import annotations

import argparse
import math
import sys

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


def experiment_name(text: str) -> str:
    """An MLflow experiment name: refused here when empty or blank (MLflow would refuse it only once the
    work it was to record is done)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a non-empty MLflow experiment name, got {text!r}")
    if any(ord(c) < 32 for c in text):
        raise argparse.ArgumentTypeError(f"must not hold control characters, got {text!r}")
    return text


class _DeprecatedAlias(argparse.Action):
    """Stores into the new option's destination and says on stderr which spelling replaces it."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"specrank: {option_string} is deprecated and will be removed in the next release; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser, old: str, new: str, dest: str, **kwargs) -> None:
    """``old`` accepted as a hidden spelling of ``new`` for one release (docs/glossary.md lists the renames)."""
    parser.add_argument(old, dest=dest, action=_DeprecatedAlias, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kwargs)


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
