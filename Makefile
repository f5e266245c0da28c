# Every target builds its own virtual environment, so a fresh clone needs
# nothing but python3 (and redis-server for the test suite, installed by CI).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-real test-parity lint typecheck bench chaos clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/saga demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -rf -p no:cacheprovider
	SAGA_TEST_BACKEND=fakeredis $(BIN)/python -m pytest -q -rf -p no:cacheprovider -m parity

lint: $(STAMP)
	$(BIN)/ruff check saga_store workers cli tests benchmarks examples
	$(BIN)/mypy

bench: $(STAMP)
	QUICK=$(QUICK) $(BIN)/python -m benchmarks.run_all

# the chaos soak at full size (SAGAS=400 for a short one); the suite runs a short one
SAGAS ?= 10000
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos --sagas $(SAGAS)

clean:
	rm -rf $(VENV) build *.egg-info
