"""Drafters behind one interface (``specrank.decode.engine.pool.Drafter``), loaded from a spec string.

Specs: ``standalone:PATH`` (a causal LM directory sharing the target's tokenizer),
``early-exit:K`` or ``early-exit:K:HEAD`` (the target's first K layers, optionally with a
fitted linear exit head), ``eagle3:DIR`` (an EAGLE-3 head in its published format;
``eagle3:default`` is the head ``make drafter`` trains for the embedded default target).
"""

from __future__ import annotations

from specrank.decode.loading.targets import ModelLoadError

SPEC_FORMS = "standalone:PATH, early-exit:K, early-exit:K:HEAD_PATH, eagle3:DIR or eagle3:default"


def load_drafter(spec: str, target, eagle3_layers=None):
    """Build the drafter described by ``spec`` for ``target`` (same device and dtype);
    ``eagle3_layers`` (three ``hidden_states`` indices) chooses an ``eagle3:`` head's target layers."""
    kind, _, rest = str(spec).partition(":")
    if eagle3_layers is not None and kind != "eagle3":
        raise ModelLoadError(f"--eagle3-layers applies to eagle3: drafters, not {spec!r}")
    if kind == "standalone" and rest:
        from specrank.decode.loading.standalone import load_standalone

        return load_standalone(rest, target, spec)
    if kind == "early-exit" and rest:
        from specrank.decode.loading.early_exit import load_early_exit

        layers, _, head = rest.partition(":")
        if not layers.isdigit():
            raise ModelLoadError(f"drafter spec {spec!r}: K must be a number of layers")
        return load_early_exit(target, int(layers), head or None, spec)
    if kind == "eagle3" and rest:
        from specrank.decode.loading.eagle3 import load_eagle3

        return load_eagle3(rest, target, spec, eagle3_layers)
    raise ModelLoadError(f"unknown drafter spec {spec!r} (use {SPEC_FORMS})")
