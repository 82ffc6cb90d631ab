# make demo   set everything up, then run the embedded default pair through pydflash-speculative
# make test   set everything up, then run the whole test suite
# make test-fast   the fast tier: the suite without the tests marked slow or real_model (a few minutes)
# make test-rest   the tests test-fast leaves out (test-fast + test-rest = test)
# make lint        ruff over the whole tree (configured in pyproject.toml)
# The test targets run pytest-xdist workers, one per core (TEST_WORKERS=0 runs the suite in one process; tests
# write only into pytest's per-worker temporary folders, and every server binds a free port of its own)
.PHONY: setup demo test test-fast test-rest lint bench clean

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/pydflash-speculative -n 96

TEST_WORKERS ?= auto
PYTEST = .venv/bin/python -m pytest -q -n $(TEST_WORKERS)

test: setup
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow and not real_model"

test-rest: setup
	$(PYTEST) -m "slow or real_model"

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python scripts/bench/engine.py

clean:
	rm -rf .cache/build .cache/native vendor/llama.cpp vendor/.stamp
