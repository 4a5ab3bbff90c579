# Fresh machine:  make demo   (set up, build MNIST, run a small Split-MNIST benchmark)
#                 make test   (set up, build the data, run the test suite)
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: setup data test demo clean

setup:
	scripts/setup.sh

data: setup
	$(BIN)/hf-clroute data prepare

# The suite's wall time is printed at the end (CI must stay under 30 minutes), with its slowest tests.
test: data
	@start=$$(date +%s); HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest tests --durations=15; status=$$?; \
	echo "make test: the test suite took $$(( $$(date +%s) - start )) s"; exit $$status

# The demo needs only MNIST (`make data` builds every source); its backbone is the committed
# pretrained ViT (hf_clroute/backbones/pretraining/assets), installed into the cache on first use.
demo: setup
	$(BIN)/hf-clroute data prepare mnist
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(BIN)/hf-clroute demo --out runs/demo

clean:
	rm -rf runs .pytest_cache
