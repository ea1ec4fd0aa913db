# nmt: `make help` lists the targets. Hydra overrides go in ARGS, e.g.
#   make train ARGS="model=gru_bahdanau optim.lr=5e-4 trainer.max_steps=2000"
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?=
ARGS ?=
RUN ?= outputs/latest
CKPT ?=
NPROC ?= 1
NNODES ?= 1
RESTARTS ?= 0
TORCHRUN_ARGS ?=
PORT ?= 6006
N ?= 5

.DEFAULT_GOAL := help
.PHONY: help install prepare train eval translate tensorboard test test-fast lint format clean
.PHONY: attention demo-pooling
.PHONY: average tune-decode compare
.PHONY: bench bench-data bench-soak bench-recovery bench-finetune bench-hf-trainer
.PHONY: export serve bench-serve check-hf
.PHONY: docs docs-serve

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  Variables: ARGS (Hydra overrides), RUN, CKPT, NPROC, NNODES, RESTARTS, TORCH (torch build for install)"

install: $(VENV)/.installed ## Create .venv and install nmt with its dependencies (TORCH="torch==X" picks the build)

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH)" ]; then $(BIN)/python -m pip install $(TORCH); fi
	$(BIN)/python -m pip install -e ".[dev]"
	@touch $@

prepare: install ## Prepare the training data once (nmt-train does it when needed): ARGS="data=... [--verify]"
	$(BIN)/nmt-prepare $(ARGS)

# torchrun with a store of its own for each worker group, so that a restarted group never reads
# the addresses of the one before (nmt.environment: TORCH_DISABLE_SHARE_RDZV_TCP_STORE)
train: install ## Prepare data and train (default: Transformer on Multi30k de->en); NPROC=N for DDP, RESTARTS=N restarts after a failure
ifeq ($(NPROC)$(NNODES)$(RESTARTS),110)
	$(BIN)/nmt-train $(ARGS)
else
	TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 $(BIN)/torchrun --nproc-per-node=$(NPROC) --nnodes=$(NNODES) \
	  --max-restarts=$(RESTARTS) $(TORCHRUN_ARGS) -m nmt.train $(ARGS)
endif

eval: install ## Score a run's checkpoint on its test set(s): RUN=<run dir> CKPT=<file> ARGS="beam=5"
	$(BIN)/nmt-eval run=$(RUN) $(if $(CKPT),ckpt=$(CKPT)) $(ARGS)

translate: install ## Translate stdin (or ARGS="input=FILE output=FILE") with a run's best checkpoint
	$(BIN)/nmt-translate run=$(RUN) $(if $(CKPT),ckpt=$(CKPT)) $(ARGS)

OUT ?= $(RUN)/package
export: install ## Write a run's model as a self-contained package: RUN=<run dir> CKPT=<name> OUT=<dir> ARGS="--format ctranslate2 --quantize int8"
	$(BIN)/nmt-export $(RUN) $(if $(CKPT),--ckpt $(CKPT)) --out $(OUT) $(ARGS)

import: install ## Import a pretrained transformers MarianMTModel (OPUS-MT) as a run directory: SRC=<folder or Hub id> OUT=<dir>
	$(BIN)/nmt-import $(SRC) --out $(OUT)

check-hf: install ## Check a run's Hugging Face export against our decoding on its test set (JSON): RUN=<run dir> ARGS="--limit 200 --out FILE"
	$(BIN)/python scripts/check_hf.py $(RUN) $(if $(CKPT),--ckpt $(CKPT)) $(ARGS)

MODEL ?= $(RUN)/package
serve: install ## HTTP translation server over a package: MODEL=<package dir> ARGS="engine=ctranslate2 port=8080"
	$(BIN)/nmt-serve model=$(MODEL) $(ARGS)

average: install ## Average the weights of a run's last N step checkpoints: RUN=<run dir> N=5 (-> checkpoints/averaged.pt)
	$(BIN)/nmt-average $(RUN) --last $(N) $(ARGS)

tune-decode: install ## Keep a run's decoding unless another beam/length penalty is significantly better on validation: RUN=<run dir> ARGS="--apply"
	$(BIN)/nmt-tune-decode $(RUN) $(if $(CKPT),--ckpt $(CKPT)) $(ARGS)

compare: install ## Paired bootstrap of eval reports, set by set and direction by direction: ARGS="BASE.json ... --system SYS.json [--metric paper]"
	$(BIN)/nmt-compare $(ARGS)

attention: install ## Attention of a run as heatmap PNGs, or ARGS="format=html ..." as one explorer page: ARGS="sentence='Ein Mann fährt Fahrrad.'" (or input=FILE)
	$(BIN)/nmt-attention run=$(RUN) $(if $(CKPT),ckpt=$(CKPT)) $(ARGS)

demo-pooling: install ## Attention pooling demo (Nadaraya-Watson kernel regression) into outputs/demo/
	$(BIN)/python scripts/attention_pooling.py --out outputs/demo $(ARGS)

bench: install ## Benchmark training and decoding speed (JSON into outputs/bench/; ARGS="--quick", "--models transformer")
	$(BIN)/python scripts/bench.py $(ARGS)

bench-data: install ## Scale benchmark of the data path at 29k-2.9M pairs: preparation, start-up, DDP memory (JSON into outputs/bench/; ARGS="--quick")
	$(BIN)/python scripts/bench_data.py $(ARGS)

bench-soak: install ## Resident memory over a 30-minute cpu_quick run, sampled every 5 s (JSON into outputs/bench/; ARGS="--minutes 10 --early 2")
	$(BIN)/python scripts/bench_soak.py $(ARGS)

bench-finetune: install ## Fine-tuning a random model of NLLB-200-distilled-600M's shape: import, s/update, peak memory (JSON into outputs/bench/; ARGS="--freeze embeddings")
	$(BIN)/python scripts/bench_finetune.py $(ARGS)

bench-hf-trainer: install ## Fine-tuning and decoding an imported OPUS-MT-shaped model beside transformers' Seq2SeqTrainer and generate (JSON into outputs/bench/; ARGS="--quick")
	$(BIN)/python scripts/bench_hf_trainer.py $(ARGS)

bench-recovery: install ## A rank SIGKILLed under torchrun --max-restarts: seconds to resume and updates lost (JSON into outputs/bench/; ARGS="--kill-at 100 --set trainer.save_every_minutes=1")
	$(BIN)/python scripts/bench_recovery.py $(ARGS)

bench-serve: install ## Export, engines and server figures (JSON into outputs/bench/): ARGS="--transformer CKPT --transformer-base CKPT --gru CKPT"
	$(BIN)/python scripts/bench_serve.py $(ARGS)

# JoeyNMT 2.3.0 in its own venv, installed by hand (README: "Speed next to JoeyNMT"); the run
# writes JoeyNMT's Multi30k text files and sentencepiece model into JOEY_DIR when they are missing
JOEY_PYTHON ?= ../joeyvenv/bin/python
JOEY_DIR ?= ../joeywork
.PHONY: bench-peers
bench-peers: install ## Training speed beside Eole 0.6.4, Marian (pymarian 1.12.42) and JoeyNMT 2.3.0, each installed on first use into outputs/peers/venvs (JSON into outputs/bench/; ARGS="--quick", "--peers eole --models transformer")
	$(BIN)/python scripts/bench_peers.py $(ARGS)

.PHONY: bench-joeynmt
bench-joeynmt: install ## Speed next to JoeyNMT on this CPU (JOEY_PYTHON=python of its venv, installed by hand; JOEY_DIR=its working folder, filled by the run; ARGS="--quick")
	$(BIN)/python scripts/bench_joeynmt.py --joey-python $(JOEY_PYTHON) --joey-dir $(JOEY_DIR) $(ARGS)

# GPU check (README: "GPU check"): scripts/gpu_check.sh on a machine with one NVIDIA GPU, which
# installs what it lacks offline from the wheels of `make gpu-wheels` (GPU_WHEELS)
GPU_WHEELS ?= scripts/gpu_wheels
GPU_PYTHON_VERSION ?= 3.12
.PHONY: gpu-wheels gpu-check
gpu-wheels: install ## Wheels gpu_check.sh installs offline (hydra-core, omegaconf, matplotlib, sacremoses...; ctranslate2 in optional/; GPU_PYTHON_VERSION=3.12, x86_64)
	$(BIN)/python scripts/gpu_check.py fetch-wheels --dest $(GPU_WHEELS) --python-version $(GPU_PYTHON_VERSION)

gpu-check: ## On a GPU: every training path in one run of at most 8 minutes, a table of what passed (ARGS="--parts transformer,resume", "--parts quality")
	PYTHON="$(PYTHON)" NMT_GPU_WHEELS="$(GPU_WHEELS)" bash scripts/gpu_check.sh $(ARGS)

tensorboard: install ## Watch training curves and attention maps (http://localhost:6006, PORT=...)
	$(BIN)/tensorboard --logdir outputs --port $(PORT)

# one pytest-xdist worker per core (tests/conftest.py gives each its share of the cores)
TEST_WORKERS ?= logical
# the slow tests dealt among the workers, each module's tests kept together (tests/conftest.py)
XDIST := --dist loadgroup --no-loadscope-reorder
test: install ## Run the test suite on every core (TEST_WORKERS=N; fetches Multi30k into data/ once, as train does)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(XDIST) $(ARGS)

test-fast: install ## Run the tests without the slow ones, on every core
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(XDIST) -m "not slow" $(ARGS)

lint: install ## Check code style with ruff
	$(BIN)/ruff check nmt benchmarks docs/hooks tests scripts
	$(BIN)/ruff format --check nmt benchmarks docs/hooks tests scripts

format: install ## Format code with ruff
	$(BIN)/ruff format nmt benchmarks docs/hooks tests scripts
	$(BIN)/ruff check --fix nmt benchmarks docs/hooks tests scripts

# The documentation site (mkdocs.yml): reference pages and figures are generated from the code at
# build time; --strict fails on a broken link or a missing page
docs: install ## Build the documentation site into site/ (offline; open site/index.html)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

docs-serve: install ## Serve the documentation site on http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8000

clean: ## Remove caches (keeps data/ and outputs/)
	rm -rf .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
