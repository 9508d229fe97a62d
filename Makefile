# supernode-agent: the two commands are `make demo` and `make test`; both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEB_PACKAGES := snmp prometheus prometheus-alertmanager prometheus-snmp-exporter slurm-wlm munge \
                iproute2 mbpoll ethtool systemd python3-venv chromium chromium-driver etcd-server etcd-client
PYTEST_ARGS ?=

.PHONY: demo test fuzz venv peers dashboards bench clean lint deb screenshot gpu-check-deps bytecode

# The agent and the simulator (a distribution of its own, sim/pyproject.toml: the demo, the tests' rack and the
# backends a sim-backed config names come from it).
$(STAMP): pyproject.toml sim/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' -e ./sim
	touch $(STAMP)

venv: $(STAMP)

# Debian packages of the real peers the tests talk to. Their maintainer scripts must not
# start daemons on 0.0.0.0: policy-rc.d forbids it while we install.
peers:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  created=""; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created=1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; rc=$$?; \
	  [ -n "$$created" ] && rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	fi

# The demo drains through a real Slurm of its own when slurmctld is installed: set up the peers too.
demo: $(STAMP) peers
	$(VENV)/bin/supernode-sim demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Test modules run on TEST_WORKERS parallel workers (pytest-xdist; a module stays on one worker with its peers):
# the suite mostly waits on real peers and on its detectors' hold times, so 2 cores carry several modules at once
# (2026-12-07, 2 cores: 3 workers 11 min 20 s at 1.4 cores busy, 4 workers 8 min 56 s, 5 workers 7 min 55 s at
# 1.7 cores busy, the same ~2,000 s of module time in each). Modules are dispatched longest
# first (tests/module_seconds.py: --no-loadscope-reorder keeps that order). The 25 slowest tests are listed.
TEST_WORKERS ?= 5
test: $(STAMP) peers lint bytecode
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The project's own modules compiled once, at both optimisation levels the suite runs them at (the agent daemon
# runs -OO): every test starts agents and simulators, and where PYTHONDONTWRITEBYTECODE is set (CI images often set
# it) each of those hundreds of processes would otherwise compile them again (~0.25 s of CPU each). The venv's
# libraries too, at -OO (pip wrote their plain bytecode only): else every agent compiles aiohttp, pydantic, pynvml,
# pymodbus... from source at its start, 0.37 s more CPU each (0.54 -> 0.91 s to import what the demo agent imports,
# 2026-12-07); the .deb compiles its venv at both levels the same way (packaging/build_deb.py).
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 -o 0 -o 2 agent exporters sim tests bench dashboards >/dev/null
	$(PY) -m compileall -q -j 0 -o 2 $(VENV)/lib >/dev/null

# The property-based tests with the deep hypothesis profile (many random examples; minutes, not seconds), and the
# repetition loops (`repeat` marker, e.g. promtool's unit tests fifty times) that `make test` leaves out.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider -m fuzz --timeout 1800 $(PYTEST_ARGS)

dashboards: $(STAMP)
	$(PY) -m dashboards.build

# The Debian package: the agent in its own venv under /opt/supernode-agent (packaging/build_deb.py).
deb: $(STAMP)
	$(PY) packaging/build_deb.py --out build

# The README's picture of the status page during the demo's leak story (headless Chromium).
screenshot: $(STAMP) peers
	$(PY) bench/screenshot_status.py docs/status-page-leak.png

bench: $(STAMP) peers
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The pure-Python dependencies of bench/gpu_check.py, for a GPU machine whose Python has none of ours:
# a device run carries build/gpu-deps and runs `python3 bench/gpu_check.py --deps build/gpu-deps --out DIR`.
gpu-check-deps: $(STAMP)
	$(PY) bench/gpu_check.py --write-deps build/gpu-deps

clean:
	rm -rf $(VENV) build *.egg-info sim/build sim/*.egg-info
