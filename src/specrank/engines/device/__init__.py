"""A reranker's per-step work on the serving engine's own device, in plain torch: no host read inside a step, the
same code on a CPU and a GPU, so an engine plugin adds no synchronisation to the engine's step.

Modules: ``forest`` (a LightGBM booster's trees scored as tensors, equal to LightGBM's margins).
"""
