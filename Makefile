# oneknob. The two commands that matter: `make ablate` and `make test`.
# Everything installs itself into .venv on first use (idempotent, re-run when
# pyproject.toml changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The engine extra: vLLM's CUDA build where nvidia-smi sees a GPU, else vLLM's CPU build.
ENGINE_EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.setup-stamp-$(ENGINE_EXTRA)
# Which vLLM make setup installs (docs/guides/gpu.md), given on make's command line and remembered in .cache/setup-vllm
# (a later plain `make test` keeps it): VLLM=0.34.0 (a release), VLLM=/path/or/URL/vllm-...whl (a wheel), VLLM_INDEX=URL
# (an extra index: vLLM or torch built for this CUDA), VLLM_ENV=/path/to/env (an environment whose vLLM is used as it
# is: .venv becomes a link to it). None given the first time: pyproject.toml's extra (vllm==0.33.0 on a GPU).
SETUP_CHOICE := .cache/setup-vllm
ifneq ($(filter command line,$(origin VLLM) $(origin VLLM_INDEX) $(origin VLLM_ENV)),)
$(shell mkdir -p .cache && printf 'VLLM=%s\nVLLM_INDEX=%s\nVLLM_ENV=%s\n' '$(VLLM)' '$(VLLM_INDEX)' '$(VLLM_ENV)' \
  > $(SETUP_CHOICE).new && { cmp -s $(SETUP_CHOICE).new $(SETUP_CHOICE) && rm -f $(SETUP_CHOICE).new || \
  mv -f $(SETUP_CHOICE).new $(SETUP_CHOICE); })
endif
# The UI's and the tracking server's bind address: 127.0.0.1 unless HOST= is given on make's command line
# (`make ui HOST=0.0.0.0`); a HOST in the environment is never read (it is set for other reasons on clusters).
ifneq ($(origin HOST),command line)
override HOST := 127.0.0.1
endif
PORT ?= 5000
MLRUNS := $(CURDIR)/mlruns
STORE := sqlite:///$(MLRUNS)/mlflow.db
SERVER_DIR ?= $(CURDIR)/tracking-server
ALLOWED_HOSTS ?=

.PHONY: setup tiny-model vllm-contract gpu-check test test-deps test-unit test-fast test-all docs mutate demo ablate report \
  compare sync ui server ui-screenshot bench lint clean clean-builds

setup: $(STAMP)

$(STAMP): pyproject.toml $(wildcard $(SETUP_CHOICE))
	$(PYTHON) scripts/setup_check.py venv $(ENGINE_EXTRA)
	$(BIN)/python scripts/setup_check.py before $(ENGINE_EXTRA)
	@# uv (a dependency of oneknob anyway: it makes the vllm.version environments) installs in ~20 s what pip
	@# takes ~2 min for, and compiles the bytecode on both cores (the first `import vllm` is then ~5 s, not ~13 s,
	@# in each of the three processes of the first engine start). pip's find-links (the local +cpu torch wheel)
	@# is handed to it, as uv does not read pip's config. pip does it all if uv cannot.
	$(BIN)/pip install -q --disable-pip-version-check uv
	args="$$($(BIN)/python scripts/setup_check.py install-args $(ENGINE_EXTRA))" && \
	  { eval UV_FIND_LINKS="\"$$($(BIN)/python scripts/setup_check.py find-links)\"" $(BIN)/uv pip install -q \
	      --compile-bytecode --python $(BIN)/python $$args || \
	    { echo "uv could not install oneknob's dependencies: pip does it instead"; \
	      eval $(BIN)/pip install -q --disable-pip-version-check $$args; }; }
	@# PyPI's torchvision/torchaudio/torchcodec fail to import beside a +cpu torch
	@# ("operator torchvision::nms does not exist"); vLLM's text path needs none of them. Not in a VLLM_ENV (not ours).
	@if [ "$(ENGINE_EXTRA)" = cpu ] && [ ! -L $(VENV) ]; then \
	  $(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true; fi
	@# oneknob's own bytecode too (an editable install: uv compiles none of it; Python refreshes it on change): where
	@# PYTHONDONTWRITEBYTECODE is set, as on this project's machines, every worker would compile it anew
	$(BIN)/python -m compileall -q src
	$(BIN)/python -c "import hydra, mlflow, oneknob.engines.vllm.plugin"
	$(BIN)/python scripts/setup_check.py after $(ENGINE_EXTRA)
	touch $@

tiny-model: setup
	$(BIN)/python -m oneknob tiny-model

# The whole suite in one pytest, on more workers than cores: the real-vLLM tests first (tests/conftest.py orders
# them), the short ones filling the cores around them. Their engine starts wait as much as they compute (vLLM's
# 4 s shutdown, /health polls, process spawns), so a third worker keeps 2 cores busy. Tests that share a module
# fixture (one working directory, one engine per configuration) or an imported session fixture (the MLflow
# server) run on one worker (--dist loadgroup): an xdist_group mark of their own, else the group tests/conftest.py
# gives them. How vLLM runs in the suite (no torch.compile, unbound OpenMP, one folder of builds):
# tests/conftest.py. The 25 slowest test steps are listed (where the suite's time goes, for
# benchmarks/RESULTS.md); pytest's last line counts passed, failed and skipped.
TEST_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
test: setup test-deps
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadgroup --durations=25

# By area and time (docs/development.md): the in-process unit tests of the core (seconds, one process; the `unit`
# marker, tests/conftest.py); everything that starts no real engine, server or browser (the `slow` marker).
test-unit: setup
	$(BIN)/python -m pytest -q -m unit -n 0 $$(cd tests && ../$(BIN)/python -c \
	  'from conftest import UNIT_MODULES; import glob; print(*sorted("tests/" + p for m in UNIT_MODULES for p in glob.glob(f"*/{m}.py")))')

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not vllm" -n $(TEST_JOBS)

# What the slow tests need beyond .venv: a browser for the MLflow UI check (tests/project/test_ui.py). Installed from
# Debian's packages where apt-get can (root, as in CI); otherwise make test stops here saying what is missing.
test-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && echo "installing chromium (tests/project/test_ui.py)" && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); } || \
	  { echo "make test needs chromium for tests/project/test_ui.py: apt-get install -y chromium (as root)"; exit 1; }

test-all: test

# Mutation testing of the core (verdicts, search, single-variable rules, knobs, resolution, the explanation
# modules) against its in-process unit tests ([tool.mutmut] in pyproject.toml); writes docs/MUTATION.md. Not part
# of `make test` (about an hour on 2 cores). Rerun when the core changes. MUTANTS='oneknob.explain.tested.*' reruns
# only the mutants of those globs (mutmut's names) and keeps the others' results in mutants/ (valid only while no
# other source changed since they were taken).
MUTATE_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
MUTANTS ?=
mutate: setup
	$(if $(MUTANTS),,rm -rf mutants)
	start=$$(date +%s) && $(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(foreach m,$(MUTANTS),'$(m)') > mutants.log 2>&1; \
	  status=$$?; seconds=$$(( $$(date +%s) - start )); tail -c 2000 mutants.log | tr '\r' '\n' | tail -5; \
	  test $$status -eq 0 && $(BIN)/python scripts/mutation_report.py --seconds $$seconds \
	    --command "make mutate MUTATE_JOBS=$(MUTATE_JOBS)$(if $(MUTANTS), MUTANTS='$(MUTANTS)')"

# The seed's study on the synthetic engine (a simulation: seconds, no GPU, no model), into the MLflow
# experiment oneknob-synthetic; it ends naming its report.md and the MLflow page of its runs.
demo: setup
	$(BIN)/python run.py -m experiment=mtp_prompt_logprobs engine=synthetic

# The seed's study on the real engine, on the tiny local model (conf/config.yaml's default model) either way: vLLM's
# CUDA build with real CUDA graphs on a GPU, vLLM's CPU build with emulated ones without. A real MTP checkpoint on a
# GPU: make ablate ARGS=model=mimo_7b
ablate: setup
	$(BIN)/python run.py -m experiment=mtp_prompt_logprobs $(ARGS)

# The report.md of the latest sweep (or SWEEP=<id>), printed from MLflow (paste it into an issue).
report: setup
	@$(BIN)/python -m oneknob report $(if $(SWEEP),--sweep $(SWEEP))

# The comparison of the latest sweep (or SWEEP=<id>), rebuilt from MLflow: table, report.md, plots.
compare: setup
	$(BIN)/python -m oneknob compare $(if $(SWEEP),--sweep $(SWEEP))

sync: setup
	$(BIN)/python -m oneknob sync

# The MLflow UI over the local store, bound to 127.0.0.1 unless HOST= says otherwise.
ui: setup
	@mkdir -p $(MLRUNS)
	@echo "MLflow UI: http://$(HOST):$(PORT)/#/experiments?workflowType=machine_learning (runs, not GenAI traces)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui --backend-store-uri $(STORE) \
	  --default-artifact-root $(MLRUNS)/artifacts --host $(HOST) --port $(PORT)

# A tracking server a team can share, with its own store (artifacts served by it, so
# jobs on other nodes can write them). The bind address is explicit: HOST=10.1.2.3 opens it.
server: setup
	@mkdir -p $(SERVER_DIR)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow server --backend-store-uri sqlite:///$(SERVER_DIR)/mlflow.db \
	  --artifacts-destination $(SERVER_DIR)/artifacts --host $(HOST) --port $(PORT) \
	  $(if $(ALLOWED_HOSTS),--allowed-hosts $(ALLOWED_HOSTS))

ui-screenshot: setup
	$(BIN)/python scripts/ui_screenshot.py --tracking-uri http://$(HOST):$(PORT) --docs

bench: setup
	$(BIN)/python -m benchmarks.run

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link or anchor, or a page missing from
# the nav, fails. Never -q: mkdocs counts the warnings it logs, and -q logs none. make test builds it too.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check src tests run.py benchmarks scripts

# Every vLLM module, class, function, attribute, hook, flag, variable and HTTP field oneknob uses, checked against a
# release's Python sources without importing it (src/oneknob/engines/vllm/contract.py): the installed vLLM, or
# RELEASE=0.34.0 (its wheel, downloaded once into the builds folder's wheels/: 239 MB; 0.33.0's is 336 MB); then each
# study fitted to it (runners, values through its own validate_environ, patches, capture rule, install facts:
# engines/vllm/fit.py). Exit 1: a point missing or the default study broken; 2: no release to read (a broken wheel named).
RELEASE ?=
vllm-contract: setup
	$(BIN)/python -m oneknob vllm-contract $(if $(RELEASE),--release $(RELEASE))

# What a first run on a GPU must check (scripts/gpu_check.sh, at most 10 min on one H200), on the vLLM make setup
# installed (the same choice: make gpu-check VLLM=0.34.0 installs and checks that release): the CUDA build, the contract,
# a plan for this GPU by its nvidia-smi name, the seed's bug with real CUDA graphs on the tiny model, vllm serve with a
# per-length reference, and a real MTP model (GPU_CHECK_MODEL=DIR) if one is here. Exit code: the failed steps.
gpu-check: setup
	bash scripts/gpu_check.sh

# vLLM builds oneknob made (vllm.version environments, vllm.patch copies, vllm.commit overlays) unused for DAYS
DAYS ?= 14
clean-builds: setup
	$(BIN)/python -m oneknob clean-builds --days $(DAYS)

clean:
	rm -rf outputs multirun .cache .pytest_cache .ruff_cache mutants mutants.log site
	find mlruns -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
