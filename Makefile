# sendqueue: `make run` for the demo, `make test` for the whole suite. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.run-installed
DEV_STAMP := $(VENV)/.dev-installed

.PHONY: run test lint format typecheck unit bench soak aws-package clean

DURATION ?= 600

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# axe-core for the accessibility tests: from npm, pinned by its package-lock.json (npm ci),
# installed here and never at test time.
AXE_DIR := tests/e2e/axe

$(DEV_STAMP): pyproject.toml requirements/ci.lock $(AXE_DIR)/package-lock.json | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(if $(filter true,$(CI)),-c requirements/ci.lock) -e '.[dev]'
	npm ci --prefix $(AXE_DIR) --no-audit --no-fund --silent
	touch $@ $(RUN_STAMP)

## run: the embedded default (SQLite, embedded scheduler, Maildir outbox) with a demo campaign
run: $(RUN_STAMP)
	$(BIN)/sendqueue demo

## test: lint, types and the whole suite
test: $(DEV_STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup

## lint: ruff (lint + format check), mypy strict on src/, tests/ and bench/, and the import
## contracts (the layers)
lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(DEV_STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

unit: $(DEV_STAMP)
	$(BIN)/python -m pytest tests/unit -q

## bench: every benchmark against its anchor, side by side (bench/results.md); BENCH_ARGS="..."
bench: $(DEV_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

## soak: campaigns through real worker processes with faults and kills (DURATION seconds)
soak: $(DEV_STAMP)
	$(BIN)/python -m tests.soak.soak --duration $(DURATION) --policy retry --json soak-retry.json
	$(BIN)/python -m tests.soak.soak --duration $(DURATION) --policy fail --json soak-fail.json

## aws-package: Lambda bundle build/aws/ + build/sendqueue-aws.zip (no dev extras); AWS_PACKAGE_ARGS=--with-boto3
aws-package: $(RUN_STAMP)
	$(BIN)/python deploy/aws/package.py $(AWS_PACKAGE_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis $(AXE_DIR)/node_modules
