# Everyday verbs. Each target installs what it needs into .venv first (idempotent).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test lint typecheck bench demo worker api migrate clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

typecheck: install
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/storage.py

demo: install
	$(PY) -m app demo

worker: install
	$(PY) -m app worker

api: install
	$(PY) -m app api

migrate: install
	$(PY) -m app migrate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache data
