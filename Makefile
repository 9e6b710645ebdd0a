# The two commands of README.md: `make demo` and `make test`. Both set up .venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

# `make wheel` needs only Python (and Node.js when the JupyterLab bundle in nbdist/labextension is missing or older
# than labextension/src); users install the wheel with pip, without Node.js.
WHEEL_PY := $(if $(wildcard $(PY)),$(PY),python3)
NBDIST_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nbdist

.PHONY: setup demo test check acceptance lab wheel clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) scripts/run_notebook.py notebooks/01-quickstart.ipynb build/01-quickstart.ipynb

# Everything: clusters, kernels, browsers, the example notebooks. The 25 slowest tests are printed and written to
# build/durations.txt, every test's outcome and time to build/junit.xml; the last line is the suite's own total time.
test: setup
	@mkdir -p build
	start=$$(date +%s); \
		NBDIST_PROGRESS=text $(PY) -m pytest tests notebooks -m "not acceptance" --nbval-lax --nbval-cell-timeout=600 \
		-p no:cacheprovider --durations=25 --junitxml=build/junit.xml; status=$$?; \
		$(PY) scripts/slowest_tests.py build/junit.xml 25 > build/durations.txt; took=$$(( $$(date +%s) - start )); \
		echo "make test: the suite took $$((took / 60)) min $$((took % 60)) s (set-up not counted; goal: 20 min on 2 cores)"; \
		exit $$status

# The inner loop: the tests that run in this process only (no cluster, kernel, browser or other process).
check: setup
	NBDIST_PROGRESS=text $(PY) -m pytest tests -m "not cluster" -p no:cacheprovider -q --durations=10

# keras-io's own examples as notebooks with no marks, under every strategy (tests/keras_io; about 20 minutes on 2
# cores). Every test's outcome and time to build/acceptance.xml.
acceptance: setup
	@mkdir -p build
	NBDIST_PROGRESS=text $(PY) -m pytest tests/keras_io -p no:cacheprovider --durations=10 --junitxml=build/acceptance.xml

lab: setup
	$(VENV)/bin/jupyter lab

wheel:
	@rm -f dist/nbdist-*.whl
	YARN_CACHE_FOLDER="$(NBDIST_CACHE)/yarn" $(WHEEL_PY) -m pip wheel --no-deps -w dist .
	@ls dist/nbdist-*-py3-none-any.whl

clean:
	rm -rf build .pytest_cache
