# jobwheel: `make run` starts the local stack, `make test` runs lint + the whole test suite.
# Every target works on a fresh clone: `setup` is idempotent and re-runs a step only when its
# input changed (stamp files: .venv/.installed <- pyproject.toml, setup.py and the C source the
# install compiles, deploy/lib/.fetched <- pom).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LIB := deploy/lib
# Same command as deploy/broker.py's mvn_command(); -DoutputDirectory must be absolute.
MVN_FETCH := mvn -B -q -f $(CURDIR)/deploy/pom.xml \
	org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
	-DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(LIB)

.PHONY: setup test run lint format clean distclean

setup: $(VENV)/.installed $(LIB)/.fetched $(VENV)/.compose $(VENV)/.chromium

# The editable install also compiles schemas/_flat.c and schemas/_murmur2.c next to it (the
# C halves of the flat codec and of the partitioner; optional: without a compiler the install
# succeeds and both run on their Python).
# setuptools warns at every editable install of a package mapped from several folders
# ("Editable installation ... folders ... with the same name"): that one warning is silenced.
$(VENV)/.installed: pyproject.toml setup.py schemas/_flat.c schemas/_murmur2.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install -q -e '.[all,dev]'
	touch $@

# Java 17+ and Maven run the local broker; installed with apt-get only when missing and root.
$(VENV)/.jdk: | $(VENV)/.installed
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	      openjdk-17-jre-headless maven; \
	  else \
	    echo "Java 17+ and Maven 3.8+ are needed for the local Kafka broker:" \
	         "install them (Debian: apt-get install openjdk-17-jre-headless maven)" >&2; \
	    exit 1; \
	  fi; \
	fi
	touch $@

# Maven prints bare colour codes (ESC[0m) even under -B -q, which no option of its turns off:
# they are stripped, its exit status kept (pipefail), its errors still shown.
$(LIB)/.fetched: deploy/pom.xml | $(VENV)/.jdk
	mkdir -p $(LIB)
	flock $(LIB)/.lock bash -c 'set -o pipefail; rm -f $(LIB)/*.jar && \
	  $(MVN_FETCH) 2>&1 | sed "s/\x1b\[[0-9;]*m//g"'
	sha256sum deploy/pom.xml | cut -d' ' -f1 > $@

# A Compose validator for tests/unit/test_compose.py: the docker compose plugin if present,
# else Debian's docker-compose (its `config -q` needs no Docker engine). Without either and
# without root the test skips and says why.
$(VENV)/.compose: | $(VENV)/.installed
	@if docker compose version >/dev/null 2>&1 || docker-compose version >/dev/null 2>&1; then \
	  true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose; \
	else \
	  echo "note: no docker compose / docker-compose; the compose file test will be skipped"; \
	fi
	touch $@

# Headless Chromium and its WebDriver for the console's browser test
# (tests/integration/test_console_browser.py): Debian's packages, installed with apt-get only
# when missing and root. Without them and without root the test skips and says why.
$(VENV)/.chromium: | $(VENV)/.installed
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    chromium chromium-driver; \
	else \
	  echo "note: no chromium/chromedriver; the console's browser test will be skipped" \
	       "(Debian: apt-get install chromium chromium-driver)"; \
	fi
	touch $@

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Two test processes by default (TEST_PROCESSES=1 for one): each starts its own broker; the
# figures the fault tests measure are printed at the end ("figures measured by the tests").
# The 25 slowest tests are printed too, and every test's outcome and time is kept in
# $(TEST_RESULTS)/junit.xml, so a slow or growing test is on record run after run.
# A test process that dies fails the run at once (--max-worker-restart=0): a full run whose
# worker died in the wedge test waited for good on the replacement pytest-xdist started.
TEST_PROCESSES ?= 2
TEST_RESULTS := build/test-results

test: setup lint
	mkdir -p $(TEST_RESULTS)
	$(BIN)/pytest -q -n $(TEST_PROCESSES) --dist loadfile --max-worker-restart=0 --durations=25 \
	  --junitxml=$(TEST_RESULTS)/junit.xml

# Logs for a person at a terminal (JSON lines stay the default for services).
run: setup
	JOBWHEEL_LOG_FORMAT=$${JOBWHEEL_LOG_FORMAT:-text} $(BIN)/jobwheel up

# Local state (the stack's data dir: $$JOBWHEEL_DATA_DIR, by default ~/.local/share/jobwheel)
# and caches; keeps the venv and the jars (distclean removes those too). The data dir is removed
# only when its name is jobwheel or .jobwheel, so a JOBWHEEL_DATA_DIR pointing at some other
# folder is never wiped by mistake.
clean:
	-test -x $(BIN)/jobwheel && $(BIN)/jobwheel broker stop
	-@test -x $(BIN)/python && dir="$$($(BIN)/python -c 'from jobwheel.settings import get_settings; print(get_settings().data_dir)')" \
	  && case "$$dir" in */jobwheel|*/.jobwheel) echo "rm -rf $$dir"; rm -rf "$$dir";; \
	     *) echo "not removing $$dir (not named jobwheel)";; esac
	rm -rf .jobwheel .pytest_cache .ruff_cache build dist
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LIB)
	rm -f schemas/*.so
