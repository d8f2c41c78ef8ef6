from __future__ import annotations

from sluice.ops.submit import Submission, ingest_submission


def test_command_line_layout() -> None:
    sub = Submission(
        "jobs/ingest.py",
        ["--spec", "s.yaml"],
        "sluice-x",
        {"b": "2", "a": "1"},
        ["k.jar", "d.jar"],
        "spark://h:7077",
    )
    assert sub.command("spark-submit") == [
        "spark-submit",
        "--master",
        "spark://h:7077",
        "--name",
        "sluice-x",
        "--conf",
        "a=1",
        "--conf",
        "b=2",
        "--jars",
        "k.jar,d.jar",
        "jobs/ingest.py",
        "--spec",
        "s.yaml",
    ]


def test_ingest_submission_carries_delta_and_connector_jars(tmp_path, monkeypatch) -> None:
    jars = tmp_path / "spark"
    jars.mkdir()
    for name in ("delta-spark_4.1_2.13-4.1.0.jar", "spark-sql-kafka-0-10_2.13-4.1.3.jar"):
        (jars / name).touch()
    monkeypatch.setenv("SLUICE_JARS", str(tmp_path))
    sub = ingest_submission("p.yaml", pipeline_name="p", available_now=True, master="local[2]")
    assert sub.application.endswith("jobs/ingest.py")
    assert sub.application_args == ["--spec", "p.yaml", "--available-now"]
    assert sub.conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert sub.conf["spark.sql.session.timeZone"] == "UTC"
    assert [j.rsplit("/", 1)[1] for j in sub.jars] == sorted(
        ["delta-spark_4.1_2.13-4.1.0.jar", "spark-sql-kafka-0-10_2.13-4.1.3.jar"]
    )
