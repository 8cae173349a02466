# Two commands after cloning: `make book` (install, then build the book) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Two cores: one thread per process keeps torch from oversubscribing them.
export OMP_NUM_THREADS ?= 1

.PHONY: install book test generate check-generated clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

book: install
	jupyter-book build . -W -n --keep-going

test: install check-generated
	$(PY) -m pytest

generate: install
	$(PY) -m autograder generate

check-generated: install
	$(PY) -m autograder generate --check

clean:
	rm -rf _build grading
