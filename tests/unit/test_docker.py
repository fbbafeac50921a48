"""docker/ is checked statically (no Docker engine here): compose validates, files line up."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor docker compose is installed (scripts/test installs docker-compose)")


def test_compose_file_validates(tmp_path: Path) -> None:
    secret = DOCKER / "storm_secret.txt"
    created = not secret.exists()
    if created:
        secret.write_text("not-a-real-secret\n")
    try:
        out = subprocess.run(
            [*_compose(), "-f", str(DOCKER / "compose.yaml"), "config", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        if created:
            secret.unlink()
    assert out.returncode == 0, out.stderr


def test_workers_agree_on_slots_and_the_image_copies_what_exists() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    workers = {name: svc for name, svc in compose["services"].items() if "worker" in svc.get("command", [])}
    slots = {",".join(svc["command"][svc["command"].index("--workers") + 1].split(",")) for svc in workers.values()}
    assert len(slots) == 1  # every worker computes the same plan
    listed = {s.split(":")[0] for s in next(iter(slots)).split(",")}
    assert listed == {svc["hostname"] for svc in workers.values()}
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src
    conf = yaml.safe_load((DOCKER / "storm.yaml").read_text())
    assert conf["storm.messaging.bind.host"] == "0.0.0.0"
    assert conf["storm.messaging.auth.secret.file"]  # non-loopback only with authentication
    from spark_storm.config import Config

    Config.of(conf)  # every key is one we know


def test_the_cluster_profile_wires_zookeeper_nimbus_and_supervisors() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    cluster = {name for name, svc in services.items() if "cluster" in svc.get("profiles", [])}
    assert cluster == {"zookeeper", "nimbus", "supervisor-a", "supervisor-b", "submit", "stream"}
    assert all(svc.get("profiles") for svc in services.values())  # each service belongs to one deployment
    assert services["zookeeper"]["image"].startswith("zookeeper:3.9")
    conf = yaml.safe_load((DOCKER / "storm.yaml").read_text())
    assert conf["storm.zookeeper.servers"] == ["zookeeper"]  # the service name, as the containers resolve it
    from spark_storm.cluster.session import ZooKeeperAddress

    assert str(ZooKeeperAddress.parse(None, conf)) == "zookeeper:2181/storm"
    supervisors = {n: s for n, s in services.items() if s.get("command", [None])[0] == "supervisor"}
    assert set(supervisors) == {"supervisor-a", "supervisor-b"}
    for name, svc in supervisors.items():
        command = svc["command"]
        assert command[command.index("--host") + 1] == svc["hostname"] == name  # other workers reach it by name
        ports = command[command.index("--slots") + 1].split(",")
        assert {f"{p}" for p in ports} <= {str(e) for e in svc["expose"]}
        assert "topology.worker.metrics.port=0" in command  # several workers in one container
        assert "zookeeper" in svc["depends_on"]
    assert services["nimbus"]["command"][0] == "nimbus"
    submit = services["submit"]["command"]
    assert submit[0] == "submit"
    assert (ROOT / submit[1]).exists()
    assert int(submit[submit.index("--workers") + 1]) <= sum(
        len(s["command"][s["command"].index("--slots") + 1].split(",")) for s in supervisors.values()
    )


def test_cluster_supervisors_launch_workers_in_cluster_form_and_spark_follows_zookeeper(tmp_path: Path) -> None:
    """What each supervisor container would run for its slots, from its compose command line (no engine)."""
    from spark_storm.cli import build_parser
    from spark_storm.cluster.supervisor import LaunchSpec, Supervisor

    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    conf_file = yaml.safe_load((DOCKER / "storm.yaml").read_text())
    for name in ("supervisor-a", "supervisor-b"):
        args = build_parser().parse_args(services[name]["command"])
        assert args.conf == "/etc/spark-storm/storm.yaml"  # mounted from docker/storm.yaml
        overrides = dict(s.split("=", 1) for s in args.set or [])
        sup = Supervisor(
            args.zookeeper,
            args.host,
            [int(p) for p in args.slots.split(",")],
            {**conf_file, **{k: yaml.safe_load(v) for k, v in overrides.items()}},
            conf_path=args.conf,
            overrides=overrides,
            local_dir=tmp_path,
        )
        try:
            for port in sup.ports:
                command = sup.worker_command(LaunchSpec("wordcount", port, "0" * 16, 1))
                worker = command[command.index("worker") :]
                assert worker[:9] == [
                    "worker",
                    "--zookeeper",
                    "zookeeper:2181/storm",
                    "--topology-id",
                    "wordcount",
                    "--host",
                    name,
                    "--port",
                    str(port),
                ]
                assert "--workers" not in worker  # the plan comes from ZooKeeper, not a slot list
                assert worker[worker.index("--conf") + 1] == "/etc/spark-storm/storm.yaml"  # 0.0.0.0 + the secret
                worker_args = build_parser().parse_args(worker)
                assert worker_args.topology is None
                assert worker_args.topology_id == "wordcount"
        finally:
            sup.state.close()
    stream = services["stream"]
    assert stream["entrypoint"][-1] == "jobs/wordcount_to_storm.py"
    command = stream["command"]
    from spark_storm.cluster.session import ZooKeeperAddress

    assert ZooKeeperAddress.parse(command[command.index("--zookeeper") + 1]) == ZooKeeperAddress.parse(None, conf_file)
    assert "--workers" not in command
    assert (ROOT / command[command.index("--topology") + 1]).exists()
