# Two entry points: `make demo` and `make test`. Each creates .venv on first use.
# A torch already importable by $(PYTHON) is reused (pinned by a constraint, never replaced);
# where none exists, a CPU build of torch is installed into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	@bash tools/make_venv.sh "$(PYTHON)" "$(VENV)" "$(TORCH_VERSION)" "$(TORCH_CPU_INDEX)"
	@touch $@

demo: $(VENV)/.installed
	$(BIN)/lightning-gpu-boost demo $(DEMO_ARGS)

# one pytest process per CPU (pytest-xdist; tests that need several processes start their own): PYTEST_ARGS="-n 0"
# runs them in one process. Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: the tests start many
# processes that import the same modules, and each would compile them again (the venv has no bytecode compiled ahead)
test: $(VENV)/.installed
	$(BIN)/ruff check .
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n auto --dist worksteal $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
