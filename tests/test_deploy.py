"""docker-compose.yml stays in step with the code: its commands parse, its settings are read."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
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


def _check(name: str) -> list[str]:
    return COMPOSE["services"][name]["healthcheck"]["test"]


def _unescape(text: str) -> str:
    """What compose hands the container: ``$$`` is its escape for a literal ``$``."""
    return text.replace("$$", "$")


def test_compose_v2_without_a_version_key():
    assert "version" not in COMPOSE and COMPOSE["name"] == "lenserve"


def test_every_service_has_a_health_check_and_waits_for_healthy_dependencies():
    services = COMPOSE["services"]
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"
        assert not any("print(" in part for part in test), f"{name}'s check only prints"
        depends = svc.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for dep, how in depends.items():
            assert how == {"condition": "service_healthy"}, f"{name} -> {dep}"
            assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no check"


def test_the_scheduler_serves_alise_by_default_from_a_seeded_predictor():
    from services.scheduler.policies import POLICIES

    services = COMPOSE["services"]
    policy = services["scheduler"]["environment"]["LENSERVE_POLICY"]
    assert policy == "${LENSERVE_POLICY:-alise}"          # an operator may choose another
    assert policy.removesuffix("}").split(":-")[1] in POLICIES
    predictor = build_parser().parse_args(services["predictor"]["command"])
    assert predictor.seed_data == "bundled"
    # The predictor's DB is the served model's: the name the scheduler asks predictions for.
    assert predictor.model == services["executor"]["environment"]["LENSERVE_MODEL"] \
        == services["scheduler"]["environment"]["LENSERVE_MODEL"]


def _run_check(test: list[str], port: int, compose_port: int) -> int:
    argv = [_unescape(part).replace(f"127.0.0.1:{compose_port}", f"127.0.0.1:{port}")
            .replace(f"127.0.0.1/{compose_port}", f"127.0.0.1/{port}") for part in test[1:]]
    if argv[0] == "python":
        argv[0] = sys.executable
    return subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=60).returncode


def test_the_predictor_check_fails_unless_the_service_is_serving():
    """The check must read the health status: a predictor still loading (NOT_SERVING) is not
    healthy, and nothing listening is not healthy either."""
    from grpc_health.v1 import health_pb2

    from services.rpc import new_server

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def call(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    async def start():
        server, port = new_server("127.0.0.1:0", "predictor")
        await server.start()
        return server, port

    server, port = call(start())
    try:
        for status, healthy in ((health_pb2.HealthCheckResponse.NOT_SERVING, False),
                                (health_pb2.HealthCheckResponse.SERVING, True)):
            call(server.health.set("", status))
            assert (_run_check(_check("predictor"), port, 50053) == 0) == healthy, status
    finally:
        call(server.stop(0))
        loop.call_soon_threadsafe(loop.stop)
    assert _run_check(_check("predictor"), port, 50053) != 0


def test_the_qdrant_check_wants_readyz_to_answer_200():
    """Run as the Qdrant image runs it (bash, no curl) against a stand-in for /readyz."""
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    ready = threading.Event()

    class ReadyZ(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/readyz" and ready.is_set()
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), ReadyZ)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    test = _check("qdrant")
    try:
        assert _run_check(test, port, 6333) != 0
        ready.set()
        assert _run_check(test, port, 6333) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert _run_check(test, port, 6333) != 0
