"""``lenserve up``: the restart rules on fake processes and the services it builds (the real
thing end to end is in ``test_up_running.py``)."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from lenserve.entrypoints.supervisor import ServiceSpec, Supervisor

ROOT = Path(__file__).resolve().parent.parent


class FakeProc:
    count = 0

    def __init__(self, argv, **options):
        FakeProc.count += 1
        self.pid, self.returncode, self.options = FakeProc.count, None, options

    def poll(self):
        return self.returncode


def test_a_dead_service_is_reported_and_restarted_with_backoff():
    now, reports = [0.0], []
    sup = Supervisor([ServiceSpec("executor", ("x",), "grpc://h:1")], spawn=FakeProc,
                     report=reports.append, clock=lambda: now[0])
    sup.start_all()
    sup.running["executor"].proc.returncode = -9
    assert sup.poll() == [] and "killed by SIGKILL" in reports[-1]
    now[0] = 0.6
    assert sup.poll() == ["executor"] and "restarted" in reports[-1]
    sup.running["executor"].proc.returncode = 1      # a crash loop waits longer each time
    now[0] = 1.0
    assert sup.poll() == []
    now[0] = 1.6
    assert sup.poll() == []
    now[0] = 2.1
    assert sup.poll() == ["executor"] and sup.running["executor"].restarts == 2


def test_swap_space_adds_a_kvmanager_between_executor_and_scheduler():
    from lenserve.cli import build_parser
    from lenserve.commands.up import build_specs

    def specs(*flags):
        args = build_parser().parse_args(["up", "--model", "fake", "--no-predictor",
                                          "--port", "0", "--scheduler-port", "0", *flags])
        return {s.name: s for s in build_specs(args)}, [s.name for s in build_specs(args)]

    by_name, order = specs()
    assert "kvmanager" not in by_name and "--kvmanager" not in by_name["scheduler"].argv
    by_name, order = specs("--swap-space", "0.5", "--kv-int8")
    assert order.index("executor") < order.index("kvmanager") < order.index("scheduler")
    kv = by_name["kvmanager"].argv
    assert kv[kv.index("--executor") + 1] == by_name["executor"].url and "--int8" in kv
    sched = by_name["scheduler"].argv
    assert sched[sched.index("--kvmanager") + 1] == by_name["kvmanager"].url


def _specs(monkeypatch, *flags, environ=None) -> dict[str, ServiceSpec]:
    """``up``'s services for FLAGS, the published ports taken as given (not claimed)."""
    from lenserve.cli import build_parser
    from lenserve.commands import up

    for key in ("LENSERVE_POLICY", "LENSERVE_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in (environ or {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(up, "claim_port", lambda host, port, what, flag: port)
    args = build_parser().parse_args(["up", "--model", "fake", *flags])
    return {s.name: s for s in up.build_specs(args)}


def _flag(argv, name: str) -> str:
    return argv[argv.index(name) + 1]


def test_defaults_serve_alise_from_a_seeded_predictor_on_the_documented_ports(monkeypatch):
    specs = _specs(monkeypatch)
    sched, predictor = specs["scheduler"].argv, specs["predictor"].argv
    assert _flag(sched, "--policy") == "alise" and _flag(predictor, "--seed-data") == "bundled"
    assert _flag(sched, "--predictor") == specs["predictor"].url
    assert specs["scheduler"].url == "grpc://127.0.0.1:50051"
    assert specs["gateway"].url == "http://127.0.0.1:8000"
    assert dict(specs["gateway"].env) == {"LENSERVE_API_KEY": ""}


def test_policy_ports_seed_and_key_can_be_chosen(monkeypatch):
    specs = _specs(monkeypatch, "--port", "9100", "--scheduler-port", "9101", "--api-key", "k1",
                   "--predictor-seed", "none", environ={"LENSERVE_API_KEY": "k2"})
    assert specs["gateway"].url.endswith(":9100") and specs["scheduler"].url.endswith(":9101")
    assert dict(specs["gateway"].env) == {"LENSERVE_API_KEY": "k1,k2"}
    assert "k1" not in " ".join(specs["gateway"].argv)     # keys stay out of `ps`
    assert _flag(specs["predictor"].argv, "--seed-data") == "none"
    specs = _specs(monkeypatch, environ={"LENSERVE_POLICY": "vllm"})
    assert _flag(specs["scheduler"].argv, "--policy") == "vllm"


def test_replicas_put_a_router_on_the_scheduler_port_in_front_of_n_replicas(monkeypatch):
    specs = _specs(monkeypatch, "--replicas", "3", "--router-policy", "least-loaded")
    schedulers = [specs[f"scheduler-{i}"] for i in range(3)]
    assert all(f"executor-{i}" in specs for i in range(3)) and "scheduler" not in specs
    for i, sched in enumerate(schedulers):       # each replica drives its own executor
        assert _flag(sched.argv, "--executor") == specs[f"executor-{i}"].url
    router = specs["router"]
    assert router.url == "grpc://127.0.0.1:50051"        # what the SDK and the gateway dial
    assert _flag(router.argv, "--replicas").split(",") == \
        [s.url.removeprefix("grpc://") for s in schedulers]
    assert _flag(router.argv, "--policy") == "least-loaded"
    assert _flag(router.argv, "--predictor") == specs["predictor"].url
    assert _flag(specs["gateway"].argv, "--scheduler") == router.url


def test_a_taken_port_stops_up_before_any_service_starts(capsys):
    from lenserve.cli import main
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag in ("--port", "--scheduler-port"):
            other = "--scheduler-port" if flag == "--port" else "--port"
            assert main(["up", "--model", "fake", flag, str(port), other, "0"]) == 2
            err = capsys.readouterr().err
            assert f"127.0.0.1:{port} is taken" in err and flag in err, err


def test_children_are_spawned_with_their_env_and_to_die_with_the_supervisor():
    sup = Supervisor([ServiceSpec("gateway", ("x",), "http://h:1", env=(("K", "v"),))],
                     spawn=FakeProc, report=lambda _: None)
    sup.start_all()
    options = sup.running["gateway"].proc.options
    assert options["env"]["K"] == "v" and options["env"]["PATH"] == os.environ["PATH"]
    assert callable(options["preexec_fn"]) == sys.platform.startswith("linux")


def test_the_predictor_service_seeds_a_model_it_does_not_hold_once(tmp_path):
    """``up``'s predictor (``predictor serve --seed-data bundled``) starts from the bundled seed,
    and a DB that already holds the model (one that outlived a restart) is not seeded again."""
    import argparse

    from services.predictor.__main__ import seed_if_empty
    from services.predictor.config import PredictorConfig
    from services.predictor.core import Predictor
    from services.predictor.local import load_seed

    core = Predictor(PredictorConfig(default_model="m"))
    try:
        seed = argparse.Namespace(model="m", seed_data="bundled")
        # the seed's repeated prompts are one point each
        assert seed_if_empty(core, seed) and core.store.count("m") > len(load_seed()[0]) // 2
        seeded = core.store.count("m")
        assert seed_if_empty(core, seed) and core.store.count("m") == seeded
        assert core.predict(["Write a poem about the sea."], "m")[0].source.value != "default"
        missing = argparse.Namespace(model="other", seed_data=str(tmp_path / "absent.jsonl"))
        assert not seed_if_empty(core, missing) and "other" not in core.store.models()
    finally:
        core.close()
