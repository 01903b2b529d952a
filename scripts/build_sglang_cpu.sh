#!/usr/bin/env bash
# SGLang's CPU engine in its own venv, built from an SGLang source checkout (docs/sglang.md):
#
#   scripts/build_sglang_cpu.sh SGLANG_SRC [VENV]        # VENV default: .venv-sglang beside this repository
#
# SGLANG_SRC is a checkout of upstream SGLang at a tag (git clone --branch v0.5.18 --depth 1
# https://github.com/sgl-project/sglang); no PyPI release ships the CPU kernel sources (the sdist holds python/
# only, see docs/sglang.md). Steps: torch 2.13.0+cpu; the CPU kernel package sglang-kernel-cpu built from the
# checkout's kernel folder (pyproject_cpu.toml: sgl-kernel/ before the move, python/sglang/kernels/aot/ at v0.5.18)
# with `pip wheel --no-build-isolation` (needs libnuma-dev; about 11 min and 1.6 GB on 2 cores); the fix of
# SGLang PR #36430 applied to the checkout (PR #24013 left `seq_lens = forward_batch.seq_lens` in the intel_amx
# backend's forward_extend and forward_decode, which overrides the verify pass's lengths: trees crash on
# CHECK_EQ(attn_logits.size(0), num_seqs), chains decode garbage); SGLang's python/ with pyproject_cpu.toml; this
# repository (specrank, whose entry point registers the plugin). Run SGLang with SGLANG_USE_CPU_ENGINE=1.
set -euo pipefail

die() { echo "build_sglang_cpu.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: scripts/build_sglang_cpu.sh SGLANG_SRC [VENV]"
SRC=$(cd "$1" 2>/dev/null && pwd) || die "SGLANG_SRC $1: no such directory"
[ -f "$SRC/python/pyproject_cpu.toml" ] || die "SGLANG_SRC $SRC: no python/pyproject_cpu.toml (not an SGLang checkout)"
KERNEL=""
for k in "$SRC/sgl-kernel" "$SRC/python/sglang/kernels/aot"; do
  [ -f "$k/pyproject_cpu.toml" ] && KERNEL=$k
done
[ -n "$KERNEL" ] || die "SGLANG_SRC $SRC: no sgl-kernel/pyproject_cpu.toml or python/sglang/kernels/aot/pyproject_cpu.toml"
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${2:-$REPO/.venv-sglang}
TORCH=${SPECRANK_SGLANG_TORCH:-2.13.0+cpu}
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
# the +cpu wheel: from pip's configured indexes and find-links, else PyTorch's CPU index
$PIP install "torch==$TORCH" || $PIP install "torch==$TORCH" --extra-index-url https://download.pytorch.org/whl/cpu
mkdir -p "$VENV/wheels"
(cd "$KERNEL" && cp pyproject_cpu.toml pyproject.toml && \
  nice -n 19 $PIP wheel --no-build-isolation --no-deps -w "$VENV/wheels" . && git checkout -- pyproject.toml 2>/dev/null || true)
$PIP install "$VENV"/wheels/sglang_kernel_cpu-*.whl
(cd "$SRC/python" && cp pyproject_cpu.toml pyproject.toml && $PIP install . && git checkout -- pyproject.toml 2>/dev/null || true)
$PIP install -e "$REPO"
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sgl_kernel, sglang; print('sglang', sglang.__version__, 'with', sgl_kernel.__file__)"
echo "built $VENV: run SGLang with SGLANG_USE_CPU_ENGINE=1 and SPECRANK_RERANKER=reranker:default"
