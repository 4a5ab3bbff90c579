# Fresh machine:  make demo   (set up, build MNIST, run a small Split-MNIST benchmark)
#                 make test   (set up, build the data, run the test suite)
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_DISABLE_TELEMETRY := 1
# When make started: `make test` prints its wall time, prerequisites included.
START := $(shell date +%s)

# Two pytest workers, one per core (each test file stays on one worker: its module fixtures are built once).
PYTEST_FLAGS ?= -n 2 --dist loadfile

.PHONY: setup data test demo clean

setup:
	scripts/setup.sh

data: setup
	$(BIN)/hf-clroute data prepare

# ruff, the docs site (into site/, which tests/test_docs_site.py then opens in a browser) and the test
# suite; each runs even if one before it failed. The wall time of the whole `make test`, setup and
# data included, is printed at its end (CI's limit is 90 minutes; the target is 20), with the slowest tests.
test: data
	@fail=""; \
	$(BIN)/ruff check . || fail="$$fail ruff"; \
	$(BIN)/mkdocs build --strict --quiet --site-dir site || fail="$$fail mkdocs"; \
	HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest tests $(PYTEST_FLAGS) --durations=15 || fail="$$fail pytest"; \
	echo "make test: $$(( $$(date +%s) - $(START) )) s in all (setup, data, ruff, docs site, tests)"; \
	if [ -n "$$fail" ]; then echo "make test: failed:$$fail"; exit 1; fi

# The demo needs only MNIST (`make data` builds every source); its backbone is the committed
# pretrained ViT (hf_clroute/backbones/pretraining/assets), installed into the cache on first use.
demo: setup
	$(BIN)/hf-clroute data prepare mnist
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(BIN)/hf-clroute demo --out runs/demo

clean:
	rm -rf runs site .pytest_cache
