# Each target sets up its own virtual environment, idempotently (a stamp records the installed pyproject).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal --durations=15

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_eval.py
	$(BIN)/python benchmarks/bench_structural.py
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_sweep_memory.py
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_search_speed.py
	$(BIN)/python benchmarks/bench_serve_sim.py --requests 12000

clean:
	rm -rf $(VENV) build *.egg-info
