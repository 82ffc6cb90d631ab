# make demo   set everything up, then run the embedded default pair through pydflash-speculative
# make test   set everything up, then run the whole test suite
.PHONY: setup demo test bench clean

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/pydflash-speculative -n 96

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python scripts/bench.py

clean:
	rm -rf .cache/build .cache/native vendor/llama.cpp vendor/.stamp
