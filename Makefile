# kvsim — the README's two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
ORACLE ?= .oracle-venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
KVSIM   = $(VENV)/bin/kvsim
DEMO_TRACE ?= traces/demo_mixture.jsonl
OUT    ?= out

.PHONY: demo test oracle bench venv venv-test aot clean

$(VENV)/.stamp-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip >/dev/null 2>&1 || true
	$(PIP) install -q -e .
	touch $@

# The readers' and replays' kernels compiled ahead of time (kvsim/kernels/aot.py; a C compiler needed):
# rebuilt when a kernel's source changes; without them kvsim loads numba's kernels instead.
AOT = kvsim/kernels/prebuilt/aot/aot.json
$(AOT): $(VENV)/.stamp-base kvsim/build_aot.py $(wildcard kvsim/kernels/*.py kvsim/engines/vllm/*.py kvsim/io/*/*.py)
	$(PY) -m kvsim.build_aot || echo "WARNING: the kernels could not be built ahead of time; kvsim uses numba's"

# torch 2.13.0 is the CPU build these machines serve from local disk.
$(VENV)/.stamp-test: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[test]' 'torch==2.13.0'
	touch $@

venv: $(VENV)/.stamp-base $(AOT)
venv-test: $(VENV)/.stamp-test $(AOT)
aot: $(AOT)

## demo: install kvsim and run the main job on a bundled trace
demo: venv
	@mkdir -p $(OUT)
	$(KVSIM) analyze $(DEMO_TRACE)
	$(KVSIM) simulate $(DEMO_TRACE) --policy all --capacity 20000
	$(KVSIM) report $(DEMO_TRACE) -o $(OUT)/report.html --capacity 20000

## oracle: the real vLLM 0.33.0 and SGLang 0.5.23 cache code in $(ORACLE) (CPU only)
oracle:
	scripts/oracle-setup.sh $(ORACLE)

## test: the whole suite; differential tests use $(ORACLE) when it can be built
test: venv-test
	@scripts/oracle-setup.sh $(ORACLE) || echo "WARNING: oracle environment could not be built; differential tests will be skipped"
	KVSIM_ORACLE_PYTHON=$(abspath $(ORACLE))/bin/python $(PY) -m pytest -q

bench: venv-test oracle
	export KVSIM_ORACLE_PYTHON=$(abspath $(ORACLE))/bin/python; $(PY) bench/bench_apc.py && $(PY) bench/bench_radix.py && $(PY) bench/bench_analyze.py && $(PY) bench/bench_sweep.py && $(PY) bench/bench_sched.py

clean:
	rm -rf $(VENV) $(OUT) build *.egg-info kvsim/kernels/prebuilt
