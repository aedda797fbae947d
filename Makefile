# The two commands of the README. Each creates the virtualenv and installs what it needs on first use: `run` the bot
# alone, `test` the bot and the dev tools. Both install the versions pinned in constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# setuptools notes, in ten lines each time, that an editable install imports the packages from this folder: the point
# of one.
PIP := PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install --quiet --disable-pip-version-check \
  --constraint constraints.txt
# One stamp per install: `make run`, then `make test`, still installs the dev tools (and either reinstalls after
# pyproject.toml or constraints.txt changes).
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev

.PHONY: run test lint bench install install-dev test-packages constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip

$(RUNTIME): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	touch $@

$(DEV): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[dev]'
	touch $@ $(RUNTIME)

install: $(RUNTIME)

install-dev: $(DEV)

run: $(RUNTIME)
	$(BIN)/python -m bot run

# The browser test drives Debian's chromium (Playwright cannot download its own browser here); the pooler test
# runs Debian's pgbouncer in front of the test Postgres.
test-packages:
	@test -x /usr/bin/chromium -a -x /usr/sbin/pgbouncer || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium fonts-noto-color-emoji pgbouncer; \
	  else echo "The tests need Debian's chromium and pgbouncer: sudo apt-get install chromium fonts-noto-color-emoji pgbouncer" >&2; \
	  exit 1; fi; }

test: $(DEV) test-packages docs
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2

# The tests that need no database, server or process (tests/conftest.py marks the others `services`), in seconds;
# a test in this lane that opens a socket or starts a process fails.
.PHONY: test-fast
test-fast: $(DEV)
	$(BIN)/python -m pytest -q -m "not services"

bench: $(RUNTIME)
	$(BIN)/python -m bench

# The documentation site in site/ (mkdocs.yml; `$(BIN)/mkdocs serve` to read it while editing). Strict: a broken
# link or anchor fails the build, and `make test` builds it. The variable quiets Material's notice about MkDocs 2.
.PHONY: docs
docs: $(DEV)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# constraints.txt again from the newest releases that pyproject.toml allows: a clean virtualenv, the project with
# every extra, then pip freeze without the project itself. Run it to take upgrades, then `make test`; commit both.
constraints:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	extras=$$($(PYTHON) -c 'import tomllib; print(",".join(tomllib.load(open("pyproject.toml", "rb"))["project"].get("optional-dependencies", {})))'); \
	echo "resolving .[$$extras] in a clean virtualenv"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip; \
	"$$tmp/venv/bin/pip" install --quiet --disable-pip-version-check ".[$$extras]"; \
	{ echo "# What make, CI and the container install: pip install -c constraints.txt -e '.[dev]' (or .)"; \
	  echo "# Written by \`make constraints\` on Python $$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())') with the extras $$extras; not edited by hand."; \
	  "$$tmp/venv/bin/pip" freeze --disable-pip-version-check | grep -iv '^helpdesk[-_]bot\b'; } > constraints.txt.new; \
	mv constraints.txt.new constraints.txt; \
	echo "constraints.txt: $$(grep -vc '^#' constraints.txt) packages pinned"
