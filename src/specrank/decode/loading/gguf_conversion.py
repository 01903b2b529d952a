"""A GGUF file converted once to a float32 safetensors directory (with its tokenizer) under
``$SPECRANK_CACHE/models`` (default ``~/.cache/specrank/models``), named after the file and its sha256, and loaded
from there afterwards."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from specrank.decode.core import ModelLoadError
from specrank.errors import first_line
from specrank.files import cache_root, sha256_files

SOURCE_FILE = "specrank_source.json"  # written last: marks a finished conversion
GGUF_MAGIC = b"GGUF"


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
