"""docker/ cannot be run here (no Docker engine), so check what can go stale without one:
the compose file against the Compose Specification's JSON Schema, and that it mirrors the
layout `make cluster` starts (tests/e2e/test_cluster.py drills that layout)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from sluice import config
from tests.conftest import ROOT

DOCKER = ROOT / "docker"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def spec_schema() -> dict[str, Any]:
    path = config.jars_dir("compose") / "compose-spec.json"
    if not path.exists():
        pytest.fail(f"the Compose Specification's schema is not in {path}: run `make test` (it fetches it)")
    return json.loads(path.read_text())


def test_compose_file_is_valid_against_the_compose_specification() -> None:
    schema = spec_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    # The check can fail: the same file with a wrong type or an unknown key does not pass.
    broken = copy.deepcopy(compose())
    broken["services"]["redis"]["ports"] = "6379"
    assert list(validator.iter_errors(broken))
    assert list(validator.iter_errors(compose() | {"clusters": {}}))


def test_compose_mirrors_the_cluster_layout() -> None:
    services = compose()["services"]
    assert {"kafka-1", "kafka-2", "kafka-3", "spark-master", "spark-worker-1", "spark-worker-2"} <= set(services)
    assert {"airflow-db", "redis", "s3", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor"} <= set(
        services
    )
    assert {"airflow-triggerer", "airflow-worker-1", "airflow-worker-2", "sluice"} <= set(services)
    workers = [services["airflow-worker-1"], services["airflow-worker-2"]]
    assert [w["environment"]["SLUICE_HOSTNAME"] for w in workers] == ["worker-1", "worker-2"]
    assert {w["hostname"] for w in workers} == {"worker-1", "worker-2"}
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-worker-1"):
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://"), name
        assert env["SLUICE_STATE"].startswith("postgresql://") and env["SLUICE_STORE"].startswith("s3a://"), name
    kafka = [services[f"kafka-{n}"]["environment"] for n in (1, 2, 3)]
    assert {k["KAFKA_NODE_ID"] for k in kafka} == {1, 2, 3}
    assert all(k["KAFKA_DEFAULT_REPLICATION_FACTOR"] == 3 and k["KAFKA_MIN_INSYNC_REPLICAS"] == 2 for k in kafka)
    assert services["sluice"]["environment"]["SLUICE_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    host_ports = [p.split(":")[0] for s in services.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), "host ports collide"


def test_airflow_runs_through_sluice_with_the_spark_runtime_beside_it() -> None:
    services = compose()["services"]
    assert services["airflow-scheduler"]["command"] == ["airflow", "scheduler"]  # the image's entrypoint is `sluice`
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["sluice"]' in dockerfile
    assert "SLUICE_AIRFLOW_VENV=/opt/airflow-venv" in dockerfile and "AIRFLOW_VENV=$AIRFLOW_VENV" in dockerfile
    assert "$SLUICE_JARS/s3/.installed" in dockerfile and "$SLUICE_JARS/s3proxy/.installed" in dockerfile


def test_kafka_image_matches_the_pinned_broker() -> None:
    pinned = re.search(r"<kafka.version>([^<]+)<", (ROOT / "pom.xml").read_text()).group(1)  # type: ignore[union-attr]
    for n in (1, 2, 3):
        assert compose()["services"][f"kafka-{n}"]["image"] == f"apache/kafka:{pinned}"


def test_dockerfile_copies_only_files_that_exist() -> None:
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source.rstrip("/")).exists(), source


def test_passwords_are_secret_files_not_environment_values() -> None:
    c = compose()
    secrets = c["secrets"]
    assert all((DOCKER / s["file"]).is_file() for s in secrets.values())
    for name, service in c["services"].items():
        env = service.get("environment", {})
        assert "SLUICE_METASTORE_PASSWORD" not in env and "POSTGRES_PASSWORD" not in env, name
        assert not any(k.endswith(("FERNET_KEY", "JWT_SECRET", "SECRET_KEY")) for k in env), name
        assert set(service.get("secrets", [])) <= set(secrets), name
        for value in env.values():
            assert "/run/secrets/" not in str(value) or any(s in str(value) for s in service.get("secrets", [])), (
                f"{name} reads a secret it is not given: {value}"
            )
