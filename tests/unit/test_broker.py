from __future__ import annotations

from sluice.dev.broker import EmbeddedBroker


def broker(tmp_path) -> EmbeddedBroker:
    return EmbeddedBroker(home=tmp_path, port=29092, controller_port=29093, jars=tmp_path / "jars")


def test_properties_bind_loopback_only_in_kraft_combined_mode(tmp_path) -> None:
    props = dict(line.split("=", 1) for line in broker(tmp_path).properties().splitlines() if line)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["log.dirs"] == str(tmp_path / "data")


def test_stale_pid_file_is_not_a_running_broker(tmp_path) -> None:
    b = broker(tmp_path)
    assert b.pid() is None
    b.pid_file.write_text("1")  # pid 1 exists but is not our broker
    assert b.pid() is None
    assert b.stop() is False
    assert not b.pid_file.exists()
