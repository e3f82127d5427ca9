# Storytree. `make run` serves the app; `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-postgres lint format venv system-run system-test demo clean bench screenshots

$(STAMP): requirements.txt requirements-dev.txt
	@PYTHON=$$(bin/find-python) && { [ -x $(PY) ] || $$PYTHON -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $(STAMP)

venv: $(STAMP)

system-run:
	@bin/ensure-system-packages redis-server:redis-server

system-test: system-run
	@bin/ensure-system-packages /usr/bin/chromium:chromium

run: venv system-run
	@mkdir -p var/redis
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(VENV)/bin/honcho start -f Procfile

# Two pytest processes (pytest-xdist): each has its own test database, Redis and workers.
PYTEST_WORKERS ?= 2

test: venv system-test
	$(PY) -m pytest -n $(PYTEST_WORKERS)

# The same suite against a private PostgreSQL server started for the run.
test-postgres: venv system-test
	@bin/ensure-system-packages pg_ctlcluster:postgresql
	bin/with-postgres $(PY) -m pytest -n $(PYTEST_WORKERS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Benchmarks side by side with what users would pick instead; writes bench/RESULTS.md (~10 min).
bench: venv system-run
	$(PY) -m pip install --quiet -r requirements-bench.txt
	$(PY) bench/run_all.py

# PNGs of the player's pages (desktop and a 390 px phone) and the admin, from a throwaway
# database, redis-server and web server; written to var/screenshots/.
screenshots: venv system-test
	$(PY) bin/screenshots

clean:
	rm -rf $(VENV) var
