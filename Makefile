# Sluice: the two commands in the README are `make demo` and `make test`.
# Every target is idempotent: a second run reuses what is installed.

PYTHON     ?= python3.11
VENV       ?= .venv
AIRFLOW_VENV ?= .venv-airflow
SLUICE_HOME ?= $(CURDIR)/.sluice
SLUICE_JARS ?= $(SLUICE_HOME)/jars
export SLUICE_HOME SLUICE_JARS

BIN   := $(VENV)/bin
JARS  := $(SLUICE_JARS)
UV    := $(BIN)/uv
MVN   := mvn -q -B

.PHONY: setup cluster-setup cluster demo airflow test drills lint types docs docs-serve unit bench bench-latency bench-expectations bench-throughput bench-memory bench-sql bench-derived bench-ablation profile-ingest clean distclean help

help:
	@echo "make demo   set up, then run the device-signal and payment pipelines end to end"
	@echo "make test   set up, then lint, type-check, build the docs and run the test suite (what CI runs)"
	@echo "make drills the tests marked drill, not in make test: long fault drills (cluster layout, S3) and a few long tests"
	@echo "make docs   build the documentation site into site/ (mkdocs --strict); make docs-serve serves it"
	@echo "make airflow  set up, then start Airflow standalone on http://127.0.0.1:8080 (dags/ as DAG folder)"
	@echo "make cluster  the production layout on this machine: PostgreSQL, Redis, 3 Kafka brokers, Spark master + 2 workers, S3Proxy, Airflow + 2 Celery workers"
	@echo "make setup  install the Spark runtime (.venv), the Airflow side (.venv-airflow) and the JVM jars"
	@echo "make bench  the benchmarks below (benchmarks/results/)"
	@echo "make bench-latency       micro-batch vs continuous vs real-time mode vs the broker alone (~16 min)"
	@echo "make bench-expectations  ingest throughput with vs without the in-stream row rules (~6 min)"
	@echo "make bench-throughput    Sluice vs plain Spark vs a hand-written consumer, fixed cost, scale"
	@echo "make bench-ablation      plain Spark, then each of Sluice's stages added one at a time (~40 min)"
	@echo "make bench-memory        RSS of the embedded stack: Airflow, Kafka and one stream (~6 min)"
	@echo "make bench-sql           query latency: the SQL endpoint vs sluice sql without it (~20 min)"
	@echo "make bench-derived       windowed example: batch time and state size at 1,000 and 10,000 keys (~8 min)"
	@echo "make profile-ingest      one sluice run under Java Flight Recorder and py-spy: top frames"
	@echo "make clean  stop the broker and remove local state (tables, checkpoints, broker data)"

setup: $(BIN)/.installed $(AIRFLOW_VENV)/bin/.installed $(JARS)/kafka/.installed $(JARS)/spark/.installed $(JARS)/web/.installed \
       $(JARS)/metastore/.installed $(JARS)/sluice/sluice-sql.jar $(JARS)/sluice/sluice-storage.jar \
       $(JARS)/sluice/sluice-parse.jar $(JARS)/sluice/sluice-delta.jar
	@# The drivers' class-data archive (sluice/ops/cds.py): built when missing or stale, ~45 s.
	@$(BIN)/python -m sluice.ops.cds

# Java 17 (a JDK: the SQL endpoint's two classes are compiled) and Maven come from the OS
# packages when missing (Debian/Ubuntu, as root).
$(SLUICE_HOME)/.tools:
	@command -v javac >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1 || { \
	  echo "installing Java 17 and Maven (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; }
	@java -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|2[0-9])' || { echo "Java 17+ is required"; exit 1; }
	@mkdir -p $(SLUICE_HOME) && touch $@

# PostgreSQL's server binaries, for the test of a PostgreSQL metastore (Debian's package).
$(SLUICE_HOME)/.postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing PostgreSQL (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
	@mkdir -p $(SLUICE_HOME) && touch $@

# Debian's Chromium, for the trigger form's test in a real browser (tests/e2e/test_airflow_server.py):
# Playwright drives it, and cannot download a browser of its own here.
$(SLUICE_HOME)/.chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Chromium (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	@mkdir -p $(SLUICE_HOME) && touch $@

# Installed packages compiled once here, as pip does and uv does not by default: where
# PYTHONDONTWRITEBYTECODE is set (many images set it) no import writes a cache, and every Python
# process compiled what it imported from source again: 10 of the 34 s of an `airflow dags test`,
# 2.7 s of each Spark driver. (A venv installed before this: delete its bin/.installed.)
$(BIN)/.installed: requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(BIN)/python -m pip install -q uv==0.13.8
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python -r requirements.txt -e .
	@touch $@

# Airflow and the Spark provider get their own environment: the provider depends on
# pyspark-client, which would replace the Spark runtime's pyspark.
$(AIRFLOW_VENV)/bin/.installed: pyproject.toml | $(BIN)/.installed
	@test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(UV) pip install -q --compile-bytecode --python $(AIRFLOW_VENV)/bin/python -e '.[airflow]'
	@touch $@

# Great Expectations' Data Docs load their CSS and JavaScript from CDNs; the same files come
# once from the npm registry, so the docs render on a machine without internet.
$(JARS)/web/.installed: jobs/quality/offline_docs.py | $(BIN)/.installed
	$(BIN)/python -m jobs.quality.offline_docs fetch $(JARS)/web
	@touch $@

$(JARS)/kafka/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P kafka dependency:copy-dependencies -DoutputDirectory=$(JARS)/kafka
	@touch $@

$(JARS)/spark/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P spark dependency:copy-dependencies -DoutputDirectory=$(JARS)/spark
	@touch $@

$(JARS)/metastore/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P metastore dependency:copy-dependencies -DoutputDirectory=$(JARS)/metastore
	@touch $@

# The cluster layout's extras, not the embedded default's: S3A and the AWS SDK for tables on
# s3a:// (~600 MiB), and S3Proxy, the object store `make cluster` and the drills run.
$(JARS)/s3/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P s3 dependency:copy-dependencies -DoutputDirectory=$(JARS)/s3
	@touch $@

$(JARS)/s3proxy/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P s3proxy dependency:copy-dependencies -DoutputDirectory=$(JARS)/s3proxy
	@touch $@

# Everything the cluster layout (`make cluster`) needs beyond `make setup`.
cluster-setup: setup $(SLUICE_HOME)/.postgres $(SLUICE_HOME)/.redis $(JARS)/s3/.installed $(JARS)/s3proxy/.installed

# Redis, the Celery executor's broker in the cluster layout (Debian's package).
$(SLUICE_HOME)/.redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing Redis (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@mkdir -p $(SLUICE_HOME) && touch $@

cluster: cluster-setup
	$(BIN)/sluice cluster up

# The Compose Specification's JSON Schema, which tests/unit/test_docker.py validates
# docker/compose.yaml against: from compose-go (the reference parser) on the Go module proxy.
COMPOSE_GO := v2.16.2
$(JARS)/compose/compose-spec.json: | $(BIN)/.installed
	@mkdir -p $(@D)
	$(BIN)/python -c "import io, sys, urllib.request, zipfile; \
	  z = zipfile.ZipFile(io.BytesIO(urllib.request.urlopen(sys.argv[1], timeout=120).read())); \
	  open(sys.argv[2], 'wb').write(z.read('github.com/compose-spec/compose-go/v2@$(COMPOSE_GO)/schema/compose-spec.json'))" \
	  https://proxy.golang.org/github.com/compose-spec/compose-go/v2/@v/$(COMPOSE_GO).zip $@

# Hive's standalone JDBC driver, for the SQL endpoint's tests only (not in the runtime image).
$(JARS)/jdbc/.installed: pom.xml | $(SLUICE_HOME)/.tools
	$(MVN) -P jdbc dependency:copy-dependencies -DoutputDirectory=$(JARS)/jdbc
	@touch $@

# The SQL endpoint's read-only rule and password logins: two small classes, compiled against
# the pyspark wheel's own jars.
SQL_JAVA := $(wildcard jobs/java/sluice/sql/*.java)
$(JARS)/sluice/sluice-sql.jar: $(SQL_JAVA) | $(BIN)/.installed $(SLUICE_HOME)/.tools
	@rm -rf $(JARS)/sluice/classes && mkdir -p $(JARS)/sluice/classes
	javac -nowarn --release 17 -d $(JARS)/sluice/classes \
	  -cp "$$($(BIN)/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars/*" $(SQL_JAVA)
	jar cf $@ -C $(JARS)/sluice/classes .
	@rm -rf $(JARS)/sluice/classes

# Commits on S3 that the store itself decides (put-if-absent): Delta's log, Spark's checkpoint
# logs and the Parquet log (jobs/java/sluice/storage), compiled against the wheel's jars and delta-storage.
STORAGE_JAVA := $(wildcard jobs/java/sluice/storage/*.java)
$(JARS)/sluice/sluice-storage.jar: $(STORAGE_JAVA) $(JARS)/spark/.installed | $(BIN)/.installed $(SLUICE_HOME)/.tools
	@rm -rf $(JARS)/sluice/storage-classes && mkdir -p $(JARS)/sluice/storage-classes
	javac -nowarn --release 17 -d $(JARS)/sluice/storage-classes \
	  -cp "$$($(BIN)/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars/*:$(JARS)/spark/*" $(STORAGE_JAVA)
	jar cf $@ -C $(JARS)/sluice/storage-classes .
	@rm -rf $(JARS)/sluice/storage-classes

# The one-pass parse of a record (jobs/java/sluice/parse; see jobs/stream/one_pass.py), compiled
# against the wheel's jars.
PARSE_JAVA := $(wildcard jobs/java/sluice/parse/*.java)
$(JARS)/sluice/sluice-parse.jar: $(PARSE_JAVA) | $(BIN)/.installed $(SLUICE_HOME)/.tools
	@rm -rf $(JARS)/sluice/parse-classes && mkdir -p $(JARS)/sluice/parse-classes
	javac -nowarn --release 17 -d $(JARS)/sluice/parse-classes \
	  -cp "$$($(BIN)/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars/*" $(PARSE_JAVA)
	jar cf $@ -C $(JARS)/sluice/parse-classes .
	@rm -rf $(JARS)/sluice/parse-classes

# Delta's idempotent append without a rebuild of the table's state (jobs/java/sluice/delta;
# see DeltaSink in jobs/tables/sinks.py), compiled against the wheel's jars and delta-spark.
DELTA_JAVA := $(wildcard jobs/java/sluice/delta/*.java)
$(JARS)/sluice/sluice-delta.jar: $(DELTA_JAVA) $(JARS)/spark/.installed | $(BIN)/.installed $(SLUICE_HOME)/.tools
	@rm -rf $(JARS)/sluice/delta-classes && mkdir -p $(JARS)/sluice/delta-classes
	javac -nowarn --release 17 -d $(JARS)/sluice/delta-classes \
	  -cp "$$($(BIN)/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars/*:$(JARS)/spark/*" $(DELTA_JAVA)
	jar cf $@ -C $(JARS)/sluice/delta-classes .
	@rm -rf $(JARS)/sluice/delta-classes

demo: setup
	$(BIN)/sluice demo

airflow: setup
	$(BIN)/sluice airflow standalone

lint: setup
	$(BIN)/ruff check sluice jobs dags tests benchmarks
	$(BIN)/ruff format --check sluice jobs dags tests benchmarks

types: setup
	$(BIN)/mypy

# --strict: a broken link or anchor, or a page left out of the nav, fails the build. Not --quiet:
# it hides the warnings from the count --strict fails on, and the build passes whatever they say.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

TEST_NEEDS = $(SLUICE_HOME)/.postgres $(SLUICE_HOME)/.redis $(SLUICE_HOME)/.chromium $(JARS)/jdbc/.installed $(JARS)/s3/.installed \
      $(JARS)/s3proxy/.installed $(JARS)/compose/compose-spec.json

# The suite CI runs at every change. The tests marked `drill` (the long fault drills, and long
# tests whose checks this suite also makes on a shorter path) run with `make drills`.
test: lint types docs $(TEST_NEEDS)
	$(BIN)/pytest --timeout=900 --durations=40 -m "not drill" $(PYTEST_ARGS)

drills: setup $(TEST_NEEDS)
	$(BIN)/pytest --timeout=1800 --durations=40 -m drill $(PYTEST_ARGS)

unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: bench-latency bench-expectations bench-throughput bench-memory bench-sql bench-derived

bench-latency: setup
	$(BIN)/python benchmarks/latency.py

bench-expectations: setup
	$(BIN)/python benchmarks/expectations.py

bench-throughput: setup
	$(BIN)/python benchmarks/throughput.py

bench-ablation: setup
	$(BIN)/python benchmarks/ablation.py

bench-memory: setup
	$(BIN)/python benchmarks/memory.py

bench-sql: setup
	$(BIN)/python benchmarks/sql.py

bench-derived: setup
	$(BIN)/python benchmarks/derived.py

profile-ingest: setup
	$(BIN)/python benchmarks/profile_ingest.py
	$(BIN)/python benchmarks/profile_ingest.py --events 100 --max-offsets 10 --name small-batches

clean:
	-@test -x $(BIN)/sluice && $(BIN)/sluice kafka down >/dev/null 2>&1
	rm -rf $(SLUICE_HOME)/kafka $(SLUICE_HOME)/tables $(SLUICE_HOME)/checkpoints $(SLUICE_HOME)/logs $(SLUICE_HOME)/run

distclean: clean
	rm -rf $(VENV) $(AIRFLOW_VENV) $(SLUICE_HOME)
