# Two commands after cloning: `make book` (install, then build the book) and `make test`
# (build the book if needed, then run every test, the browser tests included).
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Two cores: one thread per process keeps torch from oversubscribing them.
export OMP_NUM_THREADS ?= 1

.PHONY: install bytecode book test test-fast screenshots generate check-generated clean train

install: $(VENV)/.installed

# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU-only build of torch
# first (Linux; see requirements.txt); left empty, pip takes torch from its usual index.
TORCH_INDEX ?=

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet torch==2.13.0 --index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# Where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it), Python keeps no compiled modules of
# a fresh clone, and each of the suite's hundreds of processes (grading runs, kernels, checks)
# compiled the course's modules again, about 0.2 CPU seconds a grading process. Compile them once.
bytecode: install
	$(PY) -m compileall -q -j 2 autograder solutions coursebook tests benchmarks book/_ext >/dev/null

# jupyter-book's build, with two pages executing at once (book/_ext/build_book.py; BOOK_JOBS=1 builds
# one page at a time, as plain `jupyter-book build . -W -n --keep-going` does).
BOOK_JOBS ?= 2

book: bytecode
	$(PY) book/_ext/build_book.py --jobs $(BOOK_JOBS) -- . -W -n --keep-going

# The browser tests (tests/book/test_browser.py) read the built site: build it first. With the
# execution cache an up-to-date book rebuilds in seconds.
# The suite runs on TEST_WORKERS xdist workers, each taking a group of tests at a time (the
# tests that share a fixture run together; tests/conftest.py). TEST_WORKERS=0 runs everything
# in one process. (Three workers on two cores were no faster, and pushed notebooks of the
# chapter harness and the adversarial batch past their time limits.) `python benchmarks/suite_time.py` runs the same and says where the time goes.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

test: bytecode check-generated book
	$(PY) -m pytest $(PYTEST_PARALLEL) --durations=25

# The tests not marked slow (see tests/conftest.py): no book, no browser, no end-to-end batch,
# no mutants or seeds graded; about a minute on 2 cores.
test-fast: bytecode
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow"

# Every page of the built book at desktop and phone width, as full-page PNGs in
# _build/screenshots/{desktop,phone}/ for a person to look at (the browser tests, saving what they see).
screenshots: install book
	BOOK_SCREENSHOTS=1 $(PY) -m pytest tests/book/test_browser.py -q

# Chapter 08's models, retrained from scratch under each of the three seeds (about an hour of 2 idle
# cores: two trainings at a time, the Transformers first), their weights, manifest and test outcomes written
# to coursebook/g2p_weights/. The book loads them while the manifest matches the code and the data;
# `python -m coursebook.g2p_experiment check` says whether it does. Then chapter 09's GPT under each seed
# (about 10 minutes each of one idle core: its training time is a target), kept in coursebook/gpt_weights/
# under the same rule (`python -m coursebook.gpt_experiment check`).
train: install
	for kind in transformer attention gru; do for seed in 0 1 2; do echo "--kinds $$kind --seeds $$seed"; done; done \
	  | xargs -P 2 -L 1 $(PY) -m coursebook.g2p_experiment train
	$(PY) -m coursebook.gpt_experiment train

generate: install
	$(PY) -m autograder generate

check-generated: install
	$(PY) -m autograder generate --check

clean:
	rm -rf _build grading
