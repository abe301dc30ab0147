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
    sources = "\n".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))
    for svc in _lenserve_services().values():
        for key in svc.get("environment", {}):
            assert key in sources, f"{key} is set in docker-compose.yml but nothing reads it"


def test_worker_runs_the_celery_app_that_defines_the_task():
    worker = COMPOSE["services"]["predictor-worker"]["entrypoint"]
    app = worker[worker.index("-A") + 1]
    module = __import__(app, fromlist=["retrain_mlp"])
    assert hasattr(module, "retrain_mlp")
