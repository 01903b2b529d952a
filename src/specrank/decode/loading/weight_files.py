"""The weight files of a Hugging Face directory, and a pickled ``.bin`` checkpoint read as data (no code runs), with
one line naming the file when it holds anything but tensors: targets, drafters and EAGLE-3 heads read them alike."""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path

import torch

from specrank.decode.core import ModelLoadError
from specrank.errors import first_line


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
