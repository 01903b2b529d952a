"""The plugin's entry point (``register``, named in ``pyproject.toml`` under ``sglang.srt.plugins``) and its
settings, read from the environment (docs/sglang.md)."""

from __future__ import annotations

import logging
import os

from specrank.engines.environment import number_setting
from specrank.engines.sglang import hooks
from specrank.engines.sglang.rescorer import TreeRescorer
from specrank.rerankers.defaults import champion_name, load_default_reranker
from specrank.rerankers.loader import load_reranker

logger = logging.getLogger(__name__)
RERANKER_ENV = "SPECRANK_RERANKER"
TEMPERATURE_ENV = "SPECRANK_TEMPERATURE"
TASK_ENV = "SPECRANK_TASK"
REQUESTS_ENV = "SPECRANK_SGLANG_REQUESTS"


def settings(environ=None) -> dict:
    """The plugin's settings from ``environ`` (default ``os.environ``); a malformed one raises a one-line
    ``ValueError`` naming its variable. An empty ``source``: the plugin is off."""
    env = os.environ if environ is None else environ
    out = {"source": env.get(RERANKER_ENV, "").strip(), "task": env.get(TASK_ENV, "")}
    out["temperature"] = number_setting(env, TEMPERATURE_ENV, float, 0.0, 0.0)
    out["capacity"] = number_setting(env, REQUESTS_ENV, int, 64, 1)
    return out


def load_rescorer(environ=None) -> TreeRescorer | None:
    """The ``rescorer.TreeRescorer`` the environment names, or None when ``SPECRANK_RERANKER`` is unset."""
    config = settings(environ)
    if not config["source"]:
        return None
    source = config["source"]
    named = champion_name(source)
    reranker = load_default_reranker(config["temperature"], named) if named else load_reranker(source)
    return TreeRescorer(reranker, source, config["temperature"], config["task"], config["capacity"])


def register() -> None:
    """SGLang's entry point: wrap the draft, ``organize_draft_results`` and ``eagle_sample`` when
    ``SPECRANK_RERANKER`` names a reranker (``hooks``)."""
    rescorer = load_rescorer()
    if rescorer is None:
        logger.info("specrank: %s is unset; SGLang's draft tree is left as it is", RERANKER_ENV)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # SGLang: only inside its own processes

    for target, make in ((hooks.DRAFT, hooks.around_draft), (hooks.ORGANIZE, hooks.around_organize),
                         (hooks.SAMPLE, hooks.around_sample)):
        HookRegistry.register(target, make(rescorer), HookType.AROUND)
    logger.info("specrank: SGLang's draft tree rescored by %s (%s)", rescorer.strategy.source,
                rescorer.strategy.compiled.inference)
