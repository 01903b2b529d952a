"""Run SGLang's CPU engine on an AVX-512 CPU without AMX (``bench_sglang.py --amx-override``; docs/sglang.md).

SGLang v0.5.18 asks ``torch.cpu._is_amx_tile_supported()`` once at import and, on a CPU without AMX, replaces the
``intel_amx`` attention backend by ``torch_native``, which has no EAGLE draft or tree verify. Its CPU kernels hold
no AMX instruction of their own: their matrix products go through ``at::native::cpublas::brgemm``, which oneDNN
dispatches at run time to what the CPU has (AVX-512 BF16 here). This file, put on ``PYTHONPATH`` of the engine's
processes with ``SPECRANK_SGLANG_AMX_OVERRIDE=1``, answers that question yes, so SGLang takes its AMX path and
oneDNN runs it on AVX-512. Nothing else changes; without the variable it does nothing.
"""

import os

if os.environ.get("SPECRANK_SGLANG_AMX_OVERRIDE") == "1":
    import torch

    torch.cpu._is_amx_tile_supported = lambda: True
