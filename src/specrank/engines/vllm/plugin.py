"""The plugin's entry point (``register``, named in ``pyproject.toml`` under ``vllm.general_plugins``) and its
settings, read from the environment (docs/vllm.md).

vLLM calls ``register`` in each of its processes. With ``SPECRANK_RERANKER`` unset it does nothing. Set, it names a
first-step reranker (``reranker:default``: the shipped one of the law, ``rerankers.defaults.shipped_first_step_dir``;
or a format-2 directory or zip: ``specrank.rerankers.loader``) and the
plugin wraps vLLM's draft step and sampler (``hooks``): the first token of each EAGLE-3 chain is the reranker's
choice among the head's top K, the rest of the chain the head's. Any vLLM release but ``PINNED`` is refused.

Settings: ``SPECRANK_RERANKER``; ``SPECRANK_TEMPERATURE`` the law it was trained for (default 0, greedy);
``SPECRANK_VLLM_REQUESTS`` requests whose rows are kept (default 16); ``SPECRANK_VLLM_ROWS`` token-keyed rows a
request keeps (default 64; ``engines.device.rows`` states the memory).
"""

from __future__ import annotations

import logging
import os

from specrank.engines.environment import number_setting
from specrank.engines.vllm import hooks
from specrank.engines.vllm.chooser import ChainChooser
from specrank.rerankers.defaults import champion_name, load_first_step_reranker
from specrank.rerankers.loader import load_reranker

logger = logging.getLogger(__name__)
PINNED = "0.32.0"  # the vLLM release whose functions ``hooks`` wraps (``pyproject.toml``, extra ``vllm``)
RERANKER_ENV = "SPECRANK_RERANKER"
TEMPERATURE_ENV = "SPECRANK_TEMPERATURE"
REQUESTS_ENV = "SPECRANK_VLLM_REQUESTS"
ROWS_ENV = "SPECRANK_VLLM_ROWS"
CHOOSER = None  # the process's ChainChooser, once a draft step has built it (a benchmark reads its timings)


class PluginVersionError(RuntimeError):
    """vLLM is not the release the plugin wraps."""


def settings(environ=None) -> dict:
    """The plugin's settings from ``environ`` (default ``os.environ``); a malformed one raises a one-line
    ``ValueError`` naming its variable. An empty ``source``: the plugin is off."""
    env = os.environ if environ is None else environ
    return {"source": env.get(RERANKER_ENV, "").strip(),
            "temperature": number_setting(env, TEMPERATURE_ENV, float, 0.0, 0.0),
            "requests": number_setting(env, REQUESTS_ENV, int, 16, 1),
            "rows": number_setting(env, ROWS_ENV, int, 64, 2)}


def check_version(version: str) -> None:
    if version != PINNED:
        raise PluginVersionError(f"specrank's vLLM plugin wraps vLLM {PINNED}, not {version}: install"
                                 f" 'specrank[vllm]' (vllm=={PINNED}) or unset {RERANKER_ENV}")


def set_active(on: bool) -> None:
    """Turn the plugin's work on or off between requests, in a running engine (a benchmark times vLLM with and
    without it prompt by prompt, in one process). A request decoded while it is off keeps no rows."""
    hooks.ACTIVE = bool(on)


def chooser_factory(reranker, config: dict):
    """``chooser_of(vocab_size, device)``: the process's ``ChainChooser``, built on its first call."""
    def chooser_of(vocab_size: int, device):
        global CHOOSER
        if CHOOSER is None:
            CHOOSER = ChainChooser(reranker, vocab_size, config["temperature"], device, config["requests"],
                                   config["rows"], config["source"])
        return CHOOSER
    return chooser_of


def register() -> None:
    """vLLM's entry point: wrap the draft step and the sampler when ``SPECRANK_RERANKER`` names a reranker."""
    config = settings()
    if not config["source"]:
        logger.info("specrank: %s is unset; vLLM's chains are left as they are", RERANKER_ENV)
        return
    import vllm  # only inside vLLM's own processes

    check_version(vllm.__version__)
    source = config["source"]
    named = champion_name(source)
    reranker = load_first_step_reranker(config["temperature"], named) if named else load_reranker(source)
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(SpecDecodeBaseProposer, "_specrank_wrapped", False):  # vLLM may load plugins more than once
        return
    chooser_of = chooser_factory(reranker, config)
    GPUModelRunner.propose_draft_token_ids = hooks.around_propose_draft_token_ids(
        GPUModelRunner.propose_draft_token_ids)
    GPUModelRunner._sample = hooks.around_sample(GPUModelRunner._sample, chooser_of)
    SpecDecodeBaseProposer.propose = hooks.around_propose(SpecDecodeBaseProposer.propose)
    SpecDecodeBaseProposer._greedy_sample = hooks.around_greedy_sample(SpecDecodeBaseProposer._greedy_sample,
                                                                       chooser_of)
    SpecDecodeBaseProposer._specrank_wrapped = True
    logger.info("specrank: the first token of vLLM's EAGLE-3 chains chosen by %s", config["source"])
