"""Decoding as a library: load a target and a drafter, build a ``Decoder``, generate.

    from specrank.decode import load_target, load_drafter, Decoder
    target = load_target("smollm2"); drafter = load_drafter("early-exit:8", target)
    dec = Decoder(target, drafter, strategy="root_draw", budget=8)
    out = dec.generate("Write a haiku about rain.", max_new_tokens=32, temperature=0)

Rooms: ``loading`` (targets, drafters), ``engine`` (pool growth, tree pass, one round, the prompt loop), ``strategies``
(what a round verifies), ``runs`` (recorder, online protocol, lossy runs, the shard writer), ``verify`` (lossless
verification; ``verify.lossy`` the lossy verification rules, arXiv 2607.26627).
"""

import importlib

# The public names, loaded on first use: ``import specrank.decode.prompts`` (the CLI's help) stays light.
_EXPORTS = {
    "ConfigError": "config", "DecodeConfig": "config",
    "Decoder": "decoder", "GenerationOutput": "decoder", "GenerationStats": "decoder",
    "PoolShape": "core",
    "ModelLoadError": "loading", "Target": "loading", "TokenizerMismatchError": "loading", "load_drafter": "loading",
    "load_target": "loading", "ModelSpec": "loading.model_spec", "Models": "loading.model_spec",
    "STRATEGY_NAMES": "strategies", "SelectionStrategy": "strategies", "StaticTreeSelection": "strategies",
    "StrategyError": "strategies", "make_strategy": "strategies",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specrank.decode' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specrank.decode.{_EXPORTS[name]}"), name)


def __dir__():
    return __all__
