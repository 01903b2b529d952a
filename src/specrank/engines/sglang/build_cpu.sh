#!/usr/bin/env bash
# SGLang's CPU engine in its own venv, built from an SGLang source checkout (docs/sglang.md):
#
#   src/specrank/engines/sglang/build_cpu.sh SGLANG_SRC [VENV]   # VENV default: .venv-sglang in this checkout
#
# SGLANG_SRC is a checkout of upstream SGLang at a tag (git clone --branch v0.5.18 --depth 1
# https://github.com/sgl-project/sglang); no PyPI release ships the CPU kernel sources (the sdist holds python/
# only, see docs/sglang.md). Steps: SGLang's pinned torch and torchvision; the CPU kernel package sglang-kernel-cpu built from the
# checkout's kernel folder (pyproject_cpu.toml: sgl-kernel/ before the move, python/sglang/kernels/aot/ at v0.5.18)
# with `pip wheel --no-build-isolation` against that torch (needs libnuma-dev; about 12 min and 1.6 GB on 2 cores); the fix of
# SGLang PR #36430 applied to the checkout (PR #24013 left `seq_lens = forward_batch.seq_lens` in the intel_amx
# backend's forward_extend and forward_decode, which overrides the verify pass's lengths: trees crash on
# CHECK_EQ(attn_logits.size(0), num_seqs), chains decode garbage); SGLang's python/ and its pinned dependencies;
# this repository (specrank, whose entry point registers the plugin) beside SGLang's transformers. Run SGLang with
# SGLANG_USE_CPU_ENGINE=1. SPECRANK_SGLANG_TORCH / SPECRANK_SGLANG_TORCHVISION override the pins.
set -euo pipefail

die() { echo "build_cpu.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: src/specrank/engines/sglang/build_cpu.sh SGLANG_SRC [VENV]"
SRC=$(cd "$1" 2>/dev/null && pwd) || die "SGLANG_SRC $1: no such directory"
[ -f "$SRC/python/pyproject_cpu.toml" ] || die "SGLANG_SRC $SRC: no python/pyproject_cpu.toml (not an SGLang checkout)"
KERNEL=""
for k in "$SRC/sgl-kernel" "$SRC/python/sglang/kernels/aot"; do
  [ -f "$k/pyproject_cpu.toml" ] && KERNEL=$k
done
[ -n "$KERNEL" ] || die "SGLANG_SRC $SRC: no sgl-kernel/pyproject_cpu.toml or python/sglang/kernels/aot/pyproject_cpu.toml"
# the checkout this script sits in (src/specrank/engines/sglang/): specrank is installed from it, editable
REPO=$(cd "$(dirname "$0")/../../../.." && pwd)
[ -f "$REPO/pyproject.toml" ] || die "$REPO: not a specrank checkout (run this script from one)"
VENV=${2:-$REPO/.venv-sglang}
dpkg -s libnuma-dev >/dev/null 2>&1 || die "libnuma-dev is not installed (apt-get install libnuma-dev)"

# PR #36430: drop the stray lines PR #24013 added after these two statements of intel_amx_backend.py
python3 - "$SRC/python/sglang/srt/layers/attention/intel_amx_backend.py" <<'PY'
import sys
path = sys.argv[1]
lines = open(path).read().split("\n")
anchors = ("_, max_extend_len = self.forward_metadata", "q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)")
stray = "seq_lens = forward_batch.seq_lens"
out, removed = [], 0
for line in lines:
    if line.strip() == stray and out and out[-1].strip() in anchors:
        removed += 1
        continue
    out.append(line)
open(path, "w").write("\n".join(out))
print(f"intel_amx_backend.py: {removed} stray seq_lens line(s) removed (PR #36430)")
PY

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --upgrade pip wheel "setuptools>=61" "setuptools-scm>=8" "scikit-build-core>=0.10" cmake ninja
# One torch for the kernel and the engine, SGLang's own pins (pyproject_cpu.toml: torch and torchvision, which
# SGLang imports at start-up): installed first, held by a constraint through everything after, and the kernel
# built against it. From PyTorch's CPU index, as SGLang's CPU guide installs them; where that index is out of reach,
# from pip's configured indexes (PyPI's x86_64 wheels are the CUDA builds: they run on a CPU, and building the
# kernel against one needs the CUDA toolkit's headers, CUDA_HOME). torchaudio stays out: a text model never imports it.
pin() { "$VENV/bin/python" - "$SRC/python/pyproject_cpu.toml" "$1" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print(next(d.split("==")[1] for d in deps if re.fullmatch(sys.argv[2] + r"==[0-9.]+", d)))
PY
}
TORCH=${SPECRANK_SGLANG_TORCH:-$(pin torch)}
VISION=${SPECRANK_SGLANG_TORCHVISION:-$(pin torchvision)}
$PIP install --timeout 20 --retries 1 "torch==$TORCH" "torchvision==$VISION" \
  --index-url https://download.pytorch.org/whl/cpu || $PIP install "torch==$TORCH" "torchvision==$VISION"
if [ "$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda is not None)')" = True ]; then
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  [ -f "$CUDA_HOME/include/cuda_runtime.h" ] || die "torch $TORCH is a CUDA build and no CUDA toolkit is at" \
    "CUDA_HOME=$CUDA_HOME: reach PyTorch's CPU index, or set CUDA_HOME"
  export CUDA_PATH=$CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"  # FindCUDA takes the toolkit from the first nvcc it finds
  # torch's CMake config links its CUDA targets to NVRTC, which a toolkit may lack: the copy torch's wheel brought
  NVRTC=$(find "$VENV" -name 'libnvrtc.so*' | head -1)
  [ -z "$NVRTC" ] || export CMAKE_ARGS="${CMAKE_ARGS:-} -DCUDA_nvrtc_LIBRARY=$NVRTC"
fi
CONSTRAINTS="$VENV/constraints.txt"
# without the local label (+cpu, +cu130), which a constraint would ask of every candidate
"$VENV/bin/python" -c 'import torch, torchvision
for m in (torch, torchvision): print(m.__name__ + "==" + m.__version__.split("+")[0])' > "$CONSTRAINTS"
mkdir -p "$VENV/wheels"
ls "$VENV"/wheels/sglang_kernel_cpu-*.whl >/dev/null 2>&1 || (cd "$KERNEL" && cp pyproject_cpu.toml pyproject.toml && \
  nice -n 19 $PIP wheel --no-build-isolation --no-deps -w "$VENV/wheels" . && git checkout -- pyproject.toml 2>/dev/null || true)
$PIP install --no-deps "$VENV"/wheels/sglang_kernel_cpu-*.whl
# SGLang's own dependencies, as pinned (transformers 5.12.1 included), less torch's family installed above
"$VENV/bin/python" - "$SRC/python/pyproject_cpu.toml" > "$VENV/sglang-requirements.txt" <<'PY'
import re, sys, tomllib
skip = {"torch", "torchvision", "torchaudio"}
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if re.split(r"[ <>=!~;\[]", dep, maxsplit=1)[0].lower() not in skip:
        print(dep)
PY
$PIP install -c "$CONSTRAINTS" -r "$VENV/sglang-requirements.txt"
(cd "$SRC/python" && cp pyproject_cpu.toml pyproject.toml && $PIP install --no-deps . && \
  git checkout -- pyproject.toml 2>/dev/null || true)
# specrank for the plugin, beside SGLang's transformers (the plugin loads no model through transformers)
"$VENV/bin/python" -c 'import transformers; print("transformers==" + transformers.__version__)' >> "$CONSTRAINTS"
$PIP install --no-deps -e "$REPO"
"$VENV/bin/python" - "$REPO/pyproject.toml" > "$VENV/specrank-requirements.txt" <<'PY'
import re, sys, tomllib
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if re.split(r"[ <>=!~;\[]", dep, maxsplit=1)[0].lower() not in {"torch", "transformers"}:
        print(dep)
PY
$PIP install -c "$CONSTRAINTS" -r "$VENV/specrank-requirements.txt"
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import torch, sgl_kernel, sglang, specrank.engines.sglang.plugin; print('sglang', sglang.__version__, 'torch', torch.__version__, 'with', sgl_kernel.__file__)"
echo "built $VENV: run SGLang with SGLANG_USE_CPU_ENGINE=1 and SPECRANK_RERANKER=reranker:default"
