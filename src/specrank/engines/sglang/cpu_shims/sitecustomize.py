"""Two shims for SGLang's CPU engine, each on only when its variable says so (docs/sglang.md).

``SPECRANK_SGLANG_AMX_OVERRIDE=1`` (``bench_sglang.py --amx-override``): run on an AVX-512 CPU without AMX.

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

# SPECRANK_SGLANG_SAMPLING_VERIFY=1 (``bench_sglang.py --sampling-verify``): SGLang's tree verification at T > 0 on the
# CPU, through its plugin hooks (registered here, applied when SGLang loads its plugins; tree_sampling.py says how).
if os.environ.get("SPECRANK_SGLANG_SAMPLING_VERIFY") == "1":
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from tree_sampling import around_eagle_sample

    HookRegistry.register("sglang.srt.speculative.eagle_utils.eagle_sample", around_eagle_sample, HookType.AROUND)
