"""docker-compose.yml stays in step with the code: its commands parse, its settings are read."""
from __future__ import annotations

from pathlib import Path

import yaml

from lenserve.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _lenserve_services():
    return {name: svc for name, svc in COMPOSE["services"].items() if svc.get("build")}


def test_lenserve_commands_parse():
    parser = build_parser()
    commands = [svc["command"] for svc in _lenserve_services().values() if "command" in svc]
    assert commands, "no lenserve service command in docker-compose.yml"
    for command in commands:
        args = parser.parse_args(command)
        assert callable(args.func)


def test_every_environment_setting_is_read_by_the_code():
    sources = "\n".join(p.read_text() for pkg in ("services", "gateway")
                         for p in (ROOT / pkg).rglob("*.py"))
    for svc in _lenserve_services().values():
        for key in svc.get("environment", {}):
            assert key in sources, f"{key} is set in docker-compose.yml but nothing reads it"


def test_worker_runs_the_celery_app_that_defines_the_task():
    worker = COMPOSE["services"]["predictor-worker"]["entrypoint"]
    app = worker[worker.index("-A") + 1]
    module = __import__(app, fromlist=["retrain_mlp"])
    assert hasattr(module, "retrain_mlp")


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_every_lenserve_service_has_a_health_check_on_its_own_port():
    for name, svc in _lenserve_services().items():
        if "command" not in svc:
            continue
        port = _flag(svc["command"], "--port")
        assert port and f"127.0.0.1:{port}" in " ".join(svc["healthcheck"]["test"]), name


def test_grpc_targets_name_a_service_listening_there():
    services = COMPOSE["services"]
    for svc in _lenserve_services().values():
        for flag in ("--executor", "--predictor", "--kvmanager", "--scheduler"):
            target = _flag(svc.get("command", []), flag)
            if target is None or not target.startswith("grpc://"):
                continue
            host, port = target.removeprefix("grpc://").split(":")
            assert host in services, f"{flag} {target}: no service {host!r}"
            assert _flag(services[host]["command"], "--port") == port, target


def test_start_order_waits_for_healthy_dependencies():
    services = COMPOSE["services"]
    depends = services["scheduler"]["depends_on"]
    for dep in ("executor", "kvmanager", "predictor"):
        assert depends[dep]["condition"] == "service_healthy" and "healthcheck" in services[dep]
    assert services["kvmanager"]["depends_on"]["executor"]["condition"] == "service_healthy"
    assert services["gateway"]["depends_on"]["scheduler"]["condition"] == "service_healthy"


def test_kvmanager_shares_the_executors_shared_memory():
    """Block bytes move through /dev/shm: the kvmanager joins the executor's IPC namespace."""
    services = COMPOSE["services"]
    assert services["executor"]["ipc"] == "shareable" and services["executor"]["shm_size"]
    assert services["kvmanager"]["ipc"] == "service:executor"
    command = services["kvmanager"]["command"]
    assert _flag(command, "--executor") == "grpc://executor:50052"


def test_health_checks_run_code_that_exists():
    from services.rpc import check_health  # noqa: F401 - the scheduler/executor checks call it
    parser = build_parser()
    for name in ("scheduler", "executor", "kvmanager"):
        args = parser.parse_args(COMPOSE["services"][name]["command"])
        assert args.func.__module__.startswith("services."), name
    args = parser.parse_args(COMPOSE["services"]["gateway"]["command"])
    assert args.func.__module__ == "gateway.__main__"


def test_gateway_health_check_probes_a_route_the_gateway_serves():
    from gateway import GatewayConfig, create_app

    probe = " ".join(COMPOSE["services"]["gateway"]["healthcheck"]["test"])
    path = probe.split("127.0.0.1:8000", 1)[1].split("'")[0]
    app = create_app(None, GatewayConfig(served_model_name="x"))
    assert path in app.openapi()["paths"], path


def test_the_image_carries_every_package_the_commands_import():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("lenserve", "lenserve_contract", "services", "gateway", "protos"):
        assert f"COPY {package} ./{package}" in dockerfile, package
