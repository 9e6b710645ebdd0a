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

# Everything: clusters, kernels, browsers, the example notebooks, on $(TEST_WORKERS) pytest-xdist workers (a file at a
# time; the tests marked `alone` after them, on one). The 25 slowest tests are printed and written to
# build/durations.txt, every test's outcome and time to build/junit*.xml; the last line is the suite's own total time.
# When a test failed, the engine logs of its cluster are kept in build/engine-logs/ and their fatal lines printed.
TEST_WORKERS ?= 2
PYTEST := NBDIST_PROGRESS=text $(PY) -m pytest -p no:cacheprovider --durations=25
test: setup
	@mkdir -p build && rm -rf build/engine-logs build/junit*.xml
	start=$$(date +%s); \
		$(PYTEST) tests notebooks -m "not acceptance and not alone" --nbval-lax --nbval-cell-timeout=600 \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --junitxml=build/junit.xml; status=$$?; \
		$(PYTEST) tests -m "alone and not acceptance" --junitxml=build/junit-alone.xml || status=1; \
		$(PY) scripts/slowest_tests.py 25 build/junit.xml build/junit-alone.xml > build/durations.txt; \
		if [ $$status -ne 0 ] && [ -d build/engine-logs ]; then \
			echo "fatal lines in the engine logs of clusters whose tests failed (build/engine-logs/):"; \
			grep -n -E -A3 "terminate called|Fatal Python error|Segmentation fault|Aborted|core dumped" \
				build/engine-logs/*.log | tail -60; \
		fi; \
		took=$$(( $$(date +%s) - start )); \
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
