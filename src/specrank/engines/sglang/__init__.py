"""specrank inside SGLang (docs/sglang.md): a plugin that rescores EAGLE-3's draft tree with a specrank reranker.

SGLang loads it from the ``sglang.srt.plugins`` entry point (``pyproject.toml``) in every process, the scheduler's
included, and calls ``plugin.register``. With ``SPECRANK_RERANKER`` unset it does nothing. Set, it names a format-2
reranker (``reranker:default``, a directory or a zip) and the plugin wraps three SGLang functions
(``hooks``): the draft step's requests are noted, ``organize_draft_results`` ranks the path scores
r(x1) prod_{d>=2} g_d(q_d) instead of prod_d q_d (``score.plugin_score``; q_d where the reranker has no per-depth
maps), and each verify pass's target rows are kept per request, by token and by address, as specrank's own
decoder keeps them (``rescorer``). Nothing here imports SGLang before ``register`` runs.

Modules: ``plugin`` (settings, entry point), ``hooks`` (SGLang's side), ``rescorer`` (the work, engine-free),
``score`` (the path score, shared with ``specrank tree-config``), ``layout`` (SGLang's tensors as a pool), ``rows``
(a request's retained CPU rows, ``RowCaches``' reads without its full-vocabulary temporaries). Beside them, for
``benchmarks/bench_sglang.py`` and imported by none of the plugin: ``runner`` (run by path in SGLang's environment),
``figures`` (its runs read without SGLang), ``cpu_shims`` (on the engine's ``PYTHONPATH``) and ``build_cpu.sh``.

Settings (environment): ``SPECRANK_RERANKER`` the reranker; ``SPECRANK_TEMPERATURE`` the law it was trained for
(default 0, greedy: SGLang's CPU verify is greedy at any temperature); ``SPECRANK_TASK`` the requests' task, if the
reranker reads one (default: unknown); ``SPECRANK_SGLANG_REQUESTS`` how many requests keep their rows (default 64).
"""
