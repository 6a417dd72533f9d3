# Every target installs what it needs into .venv (pinned by constraints.txt) on a fresh machine.
# torch==2.13.0 is the CPU wheel that installs offline on our machines; keep it pinned here,
# not in pyproject.toml (the package itself accepts a range).
PY ?= python3
VENV := .venv
# cosmic-ray's own venv (make mutation, make test)
MUT := .venv-mutation
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
INSTALL := $(PIP) install -q -c constraints.txt
export OMP_NUM_THREADS ?= 1
export PYTHONHASHSEED ?= 0

.PHONY: install test test-fast verify verify-deep mutants mutation mutation-sample bench bench-full bench-plan repro repro-full repro-gpu examples docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.stamp-test: pyproject.toml constraints.txt | $(BIN)/python
	$(INSTALL) -e '.[test]'
	touch $@

$(VENV)/.stamp-all: pyproject.toml constraints.txt | $(BIN)/python
	$(INSTALL) -e '.[test,adapters,repro,docs]'
	touch $@ $(VENV)/.stamp-test

install: $(VENV)/.stamp-all  ## everything: library, proofs, tests, adapters, repro

test: $(VENV)/.stamp-all $(MUT)/.stamp  ## ruff, the whole test suite and a fixed sample of cosmic-ray's mutants (CI runs this)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider
	$(MAKE) --no-print-directory mutation-sample

test-fast: $(VENV)/.stamp-test  ## tests without the adapter and multi-process tiers
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not adapters"

# The site needs only the docs extra (mkdocstrings reads the sources without importing them): a venv of its own.
DOCSVENV := .venv-docs
$(DOCSVENV)/.stamp: pyproject.toml constraints.txt
	$(PY) -m venv $(DOCSVENV)
	$(DOCSVENV)/bin/python -m pip --disable-pip-version-check install -q -c constraints.txt -e '.[docs]'
	touch $@

docs: $(DOCSVENV)/.stamp  ## the documentation site into site/ (MkDocs, --strict: a broken link or reference fails)
	NO_MKDOCS_2_WARNING=1 $(DOCSVENV)/bin/python -m mkdocs build --strict --site-dir site

examples: $(VENV)/.stamp-all  ## every example, on 2 gloo ranks and on one process
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_examples.py

verify: $(VENV)/.stamp-test  ## all-N z3 proofs + exhaustive N<=6; writes proofs/REPORT.md
	$(BIN)/python -m proofs verify

mutants: $(VENV)/.stamp-all  ## seeded code bugs around the table, each against the tests that must kill it
	$(BIN)/python tests/quality/code_mutants.py

# cosmic-ray in a venv of its own (its dependencies stay out of the project's); the tests run in .venv.
SAMPLE ?= 60
$(MUT)/.stamp: constraints.txt
	$(PY) -m venv $(MUT)
	$(MUT)/bin/python -m pip --disable-pip-version-check install -q -c constraints.txt cosmic-ray
	touch $@

mutation: $(VENV)/.stamp-all $(MUT)/.stamp  ## cosmic-ray's mutants beside our catalogue, SAMPLE per package (default 60; SAMPLE=0: all, hours)
	$(BIN)/python tests/quality/mutation.py --sample $(SAMPLE)

# In `make test`: the same few mutants every run (a fixed draw), so a test that stops killing one fails CI;
# each drawn survivor must be justified in tests/quality/mutation_baseline.json.  Its report stays out of the tree.
# Then every hole cosmic-ray found that a later test closed (the committed report's `rechecked` mutants, in any
# package) is applied again and the test that closed it must still fail.
mutation-sample: $(VENV)/.stamp-all $(MUT)/.stamp  ## fixed cosmic-ray mutants, and the closed holes kept closed (part of make test)
	$(BIN)/python tests/quality/mutation.py --packages odb/core odb/batching --sample 3 --seed 1 \
		--report $(MUT)/sample_report.json
	$(BIN)/python tests/quality/mutation.py --guard

verify-deep: $(VENV)/.stamp-test  ## larger exhaustive scopes (N<=10 at D<=1, N<=7 at D<=2); adds its figures to the report
	$(BIN)/python -m proofs verify --deep

# The paper's released package (online-dynamic-batching 0.1.2; its import name `odb` collides with
# ours) in a venv of its own that borrows .venv's torch through a .pth file, for `make bench`.
REL := .venv-release
$(REL)/.stamp: $(VENV)/.stamp-all
	$(PY) -m venv $(REL)
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(REL)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_main_venv.pth"
	$(REL)/bin/python -m pip --disable-pip-version-check install -q --no-deps online-dynamic-batching==0.1.2
	touch $@

bench: $(VENV)/.stamp-all $(REL)/.stamp  ## batching quality (ours, the baselines and the released package) + runtime overhead
	$(BIN)/python -m paper_repro.bench --release-python $(REL)/bin/python

bench-full: $(VENV)/.stamp-all  ## the quality grid with 8x longer epochs (max(8W, 4096) samples per rank), N = 2/8/64; about 16 min
	$(BIN)/python -m paper_repro.bench --full --no-runtime --name full

bench-first-batch: $(VENV)/.stamp-all  ## the first batch's wait and the epoch's time, the default against placement=None, 1 and 2 gloo ranks (about 5 min)
	$(BIN)/python -m paper_repro.bench_first_batch

bench-plan: $(VENV)/.stamp-all  ## how long `odb plan` takes on the planning guide's examples, by world size (about 5 min)
	$(BIN)/python -m paper_repro.bench_plan

bench-defaults: $(VENV)/.stamp-all  ## the default configuration at the 80 committed grid points against the targets, beside the opt-ins and peers (from the committed run; --run reruns it, hours)
	$(BIN)/python -m paper_repro.defaults_grid

repro: $(VENV)/.stamp-all  ## the paper's benchmarks on this machine (< 15 min on 2 cores)
	$(BIN)/python -m paper_repro.repro

# On a GPU machine, with the python it has (torch, transformers, tokenizers): nothing is installed or built.
repro-gpu:  ## the paper's headline on CUDA (about 8 min; exits 2 without CUDA); --plan-only and --toy: see paper_repro/gpu.py
	$(PY) -m paper_repro.gpu

repro-full: $(VENV)/.stamp-all  ## the larger grid
	$(BIN)/python -m paper_repro.repro --full

clean:
	rm -rf $(VENV) $(REL) $(MUT) build site *.egg-info .pytest_cache .hypothesis
