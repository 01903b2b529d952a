"""specrank and vLLM (docs/vllm.md).

``metrics``: vLLM's speculative-decoding counters read by name and shape, without importing vLLM or torch (the code
that decodes with vLLM can live in vLLM's own environment and hand its metrics over as JSON).
``plugin``: the plugin vLLM loads from its ``vllm.general_plugins`` entry point, which lets a specrank reranker
choose the first token of each EAGLE-3 chain (``chooser`` does the work on the engine's device, ``hooks`` reads
vLLM's objects).
``runner``: the vLLM benchmarks' side in vLLM's own environment, run there by path; it imports only vLLM and
``metrics`` unless a request asks for the plugin.
"""
