# The two commands of the README. Each creates the virtualenv and installs what it needs on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench install test-packages

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m bot run

# The browser test drives Debian's chromium (Playwright cannot download its own browser here); the pooler test
# runs Debian's pgbouncer in front of the test Postgres.
test-packages:
	@test -x /usr/bin/chromium -a -x /usr/sbin/pgbouncer || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium fonts-noto-color-emoji pgbouncer; \
	  else echo "The tests need Debian's chromium and pgbouncer: sudo apt-get install chromium fonts-noto-color-emoji pgbouncer" >&2; \
	  exit 1; fi; }

test: $(STAMP) test-packages
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench
