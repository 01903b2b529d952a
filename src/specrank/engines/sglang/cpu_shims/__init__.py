"""Shims for SGLang's CPU engine (docs/sglang.md), loaded by SGLang's own processes: ``bench_sglang.py`` puts this
folder on their ``PYTHONPATH``, where ``sitecustomize.py`` turns on each shim its variable names. Nothing here runs
in specrank's own processes."""
