# Two commands for a fresh machine (Python 3.10+ and make):
#   make demo   set everything up, run the main job on the local target
#   make test   set everything up, run all tests (the docker runtime's included)
# And: make check         the fast tier, for every change (docs/testing.md)
#      make test-docker   only the docker runtime's end-to-end test
# Everything lands in .venv (the project's environment) and .runtime (Triton, weights, logs).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := .runtime
# This machine's disk holds the torch build pinned in constraints/local.txt.
CONSTRAINTS ?= constraints/local.txt

.PHONY: demo test check test-docker setup venv runtime weights system-deps trained-model docker-bases lint clean

demo: setup
	$(BIN)/python -m provision.demo

# pytest-xdist workers (0: none, in-process). Two: the suite waits on servers, SSH and
# builds about half the time (docs/testing.md has the figures).
CHECK_WORKERS ?= 2
TEST_WORKERS ?= 2
# More pytest options: make test PYTEST_ARGS="--durations=40 -x"
PYTEST_ARGS ?=
PYTEST := $(BIN)/python -m pytest --dist loadgroup
# The tiers are pytest markers (pyproject.toml): the fast one leaves out what
# needs a tritonserver, a deployment or the Docker engine, but for one
# end-to-end run on the local target (marked `check`).
CHECK_TIER := check or not (triton or deploy or docker)

# The 15 slowest tests and the count of expensive operations (tests/support/budget.py) end its output.
test: setup system-deps trained-model docker-bases
	@start=$$(date +%s); $(PYTEST) --durations=15 $(PYTEST_ARGS) -n $(TEST_WORKERS); status=$$?; \
	echo "make test: pytest took $$(( $$(date +%s) - start )) s"; exit $$status

check: setup system-deps trained-model
	@start=$$(date +%s); $(PYTEST) $(PYTEST_ARGS) -n $(CHECK_WORKERS) -m "$(CHECK_TIER)"; status=$$?; \
	echo "make check: pytest took $$(( $$(date +%s) - start )) s"; exit $$status

test-docker: setup system-deps docker-bases
	$(BIN)/python -m pytest tests/test_docker_deploy.py

# The docker runtime's tests: Debian's docker.io, a dockerd of the tests' own
# (.runtime/docker: its own data root, socket and pidfile) and local stand-ins
# for the two base images, since no registry can be reached (provision/docker_engine.py);
# and the cluster tests' node image (sshd, HAProxy, firewalld) and the nvidia-pytriton wheel they install from
# (tests/support/cluster_nodes.py).
docker-bases: setup
	$(BIN)/python -m provision.docker_engine install
	$(BIN)/python -m provision.docker_engine start
	$(BIN)/python -m provision.docker_engine bases
	$(BIN)/python tests/support/cluster_nodes.py

# What the tests need from the system: sshd (the ssh-target tests start their own
# on 127.0.0.1), sudo (Ansible's become on that host) and Debian's docker-compose
# (a real Compose parser for the docker runtime's definitions; no engine is needed), HAProxy
# (the balancer of the docker runtime's cluster test, which deploys to this machine).
SYSTEM_TOOLS := /usr/sbin/sshd /usr/bin/sudo /usr/bin/docker-compose /usr/sbin/haproxy
system-deps:
	@missing=""; for tool in $(SYSTEM_TOOLS); do test -x $$tool || missing=yes; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server sudo docker-compose haproxy >/dev/null; \
	  else \
	    echo "the tests need: sudo apt-get install openssh-server sudo docker-compose haproxy" >&2; exit 1; \
	  fi; \
	fi

# tests/test_preprocessing.py's trained MobileNetV2: nsfwjs's, from the npm registry
# (tests/support/trained_mobilenet.py), read with node; Debian's nodejs and npm if they are missing.
trained-model: $(RUNTIME)/nsfwjs/package/dist/models/mobilenet_v2/model.min.js
$(RUNTIME)/nsfwjs/package/dist/models/mobilenet_v2/model.min.js: | $(VENV)/.installed
	@command -v node >/dev/null && command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  else \
	    echo "the trained-network tests need: sudo apt-get install nodejs npm" >&2; exit 1; \
	  fi; }
	$(BIN)/python tests/support/trained_mobilenet.py

setup: venv runtime weights

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml model_repository/requirements.txt client_scripts/requirements.txt $(CONSTRAINTS)
	$(PYTHON) -c 'import sys; sys.exit("Python 3.10+ needed, found " + sys.version) if sys.version_info < (3, 10) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -r model_repository/requirements.txt -r client_scripts/requirements.txt -e '.[dev]'
	touch $@

runtime: $(RUNTIME)/triton/triton-runtime.json
$(RUNTIME)/triton/triton-runtime.json: $(VENV)/.installed provision/host/tritonserver.py
	$(BIN)/python -m provision.local_serving install

weights: $(RUNTIME)/weights/SMOKE_WEIGHTS
$(RUNTIME)/weights/SMOKE_WEIGHTS: $(VENV)/.installed provision/smoke_weights.py
	$(BIN)/python -m provision.smoke_weights $(RUNTIME)/weights --force

# ansible-lint reads .ansible-lint (production profile, offline) and wants its bin folder on PATH.
lint: venv
	$(BIN)/ruff check provision tests model_repository client_scripts tasks.py
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint playbooks
	$(BIN)/hadolint Dockerfile*

clean:
	-$(BIN)/python -m provision.local_serving stop
	-$(BIN)/python -m provision.docker_engine stop
	rm -rf $(RUNTIME)
