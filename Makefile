# The two commands of README.md: `make demo` and `make test`. Both set up .venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lab clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) scripts/run_notebook.py notebooks/01-quickstart.ipynb build/01-quickstart.ipynb

test: setup
	NBDIST_PROGRESS=text $(PY) -m pytest tests notebooks --nbval-lax --nbval-cell-timeout=600 -p no:cacheprovider

lab: setup
	$(VENV)/bin/jupyter lab

clean:
	rm -rf build .pytest_cache
