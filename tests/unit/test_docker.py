"""docker/ cannot be built here (no Docker engine), so check what can go stale without one."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT

DOCKER = ROOT / "docker"


def test_compose_file_parses_and_every_service_has_an_image() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "spark-master", "spark-worker", "sluice"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
    assert services["sluice"]["environment"]["SLUICE_SPARK_MASTER"] == "spark://spark-master:7077"


def test_airflow_service_deploys_to_the_cluster() -> None:
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    airflow = services["airflow"]
    assert airflow["command"] == ["airflow", "standalone"]  # the image's entrypoint is `sluice`
    assert airflow["environment"]["SLUICE_SPARK_MASTER"] == "spark://spark-master:7077"
    assert airflow["environment"]["AIRFLOW__API__HOST"] == "0.0.0.0"
    host_ports = {p.split(":")[0] for s in services.values() for p in s.get("ports", [])}
    assert len(host_ports) == sum(len(s.get("ports", [])) for s in services.values()), "host ports collide"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "SLUICE_AIRFLOW_VENV=/opt/airflow-venv" in dockerfile and "AIRFLOW_VENV=$AIRFLOW_VENV" in dockerfile


def test_kafka_image_matches_the_pinned_broker() -> None:
    pinned = re.search(r"<kafka.version>([^<]+)<", (ROOT / "pom.xml").read_text()).group(1)  # type: ignore[union-attr]
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{pinned}"


def test_dockerfile_copies_only_files_that_exist() -> None:
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source.rstrip("/")).exists(), source


def test_the_metastore_password_is_a_secret_file_not_an_environment_value() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    secrets = compose["secrets"]
    assert all((DOCKER / s["file"]).is_file() for s in secrets.values())
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        assert "SLUICE_METASTORE_PASSWORD" not in env and "POSTGRES_PASSWORD" not in env, name
        if "SLUICE_METASTORE_PASSWORD_FILE" in env or "POSTGRES_PASSWORD_FILE" in env:
            assert set(service["secrets"]) <= set(secrets), name
