"""``lenserve up``: the whole system on this machine, one process per service on free
loopback ports: executor, the kvmanager (host KV tier, with ``--swap-space``), predictor
(embedded Qdrant, no external server), scheduler and, once the package exists, the REST
gateway. Prints the URLs; a service that dies is reported
and restarted; Ctrl-C (or SIGTERM) stops everything."""
from __future__ import annotations

import argparse
import importlib.util
import signal
import socket
import time
from functools import partial

from lenserve.entrypoints.supervisor import ServiceSpec, Supervisor, python_module


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run executor, predictor, scheduler (and the gateway) "
                              "as local processes; restart any that dies")
    p.add_argument("--model", default="opt-tiny", help="model path or preset ('fake': no model)")
    p.add_argument("--policy", default="vllm")
    p.add_argument("--policy-config", nargs="+", metavar="KEY=VALUE", default=[])
    p.add_argument("--num-gpu-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=0.0, metavar="GIB",
                   help="host KV tier: run a kvmanager service with this many GiB (0: none)")
    p.add_argument("--kv-int8", action="store_true", help="keep swapped KV as INT8")
    p.add_argument("--no-predictor", action="store_true",
                   help="no predictor service (length-aware policies then see defaults)")
    p.add_argument("--host", default="127.0.0.1", help="address every service binds")
    p.set_defaults(func=run)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def grpc_health(target: str) -> bool:
    from services.rpc import check_health
    return check_health(target)


def _grpc_spec(name: str, module: tuple[str, ...], host: str, port: int, *flags) -> ServiceSpec:
    target = f"{host}:{port}"
    argv = python_module(*module, "--host", host, "--port", str(port), *flags)
    return ServiceSpec(name, argv, f"grpc://{target}", partial(grpc_health, target))


def build_specs(args: argparse.Namespace) -> list[ServiceSpec]:
    host = args.host
    model = ("--model", args.model, "--block-size", str(args.block_size))
    sizes = [*(("--num-gpu-blocks", str(args.num_gpu_blocks)) if args.num_gpu_blocks else ()),
             *(("--max-model-len", str(args.max_model_len)) if args.max_model_len else ())]
    specs = [_grpc_spec("executor", ("services.executor",), host, free_port(host), *model, *sizes)]
    kvmanager = ()
    if args.swap_space > 0:
        specs.append(_grpc_spec("kvmanager", ("services.kvmanager",), host, free_port(host),
                                "--executor", specs[0].url, "--swap-space", str(args.swap_space),
                                *(("--int8",) if args.kv_int8 else ())))
        kvmanager = ("--kvmanager", specs[-1].url)
    predictor = "none"
    if not args.no_predictor:
        specs.append(_grpc_spec("predictor", ("services.predictor", "serve"), host,
                                free_port(host), "--model", args.model))
        predictor = specs[-1].url
    policy_config = ("--policy-config", *args.policy_config) if args.policy_config else ()
    specs.append(_grpc_spec("scheduler", ("services.scheduler",), host, free_port(host), *model,
                            *sizes, "--executor", specs[0].url, *kvmanager,
                            "--predictor", predictor,
                            "--policy", args.policy, *policy_config))
    gateway = gateway_spec(host, free_port(host), specs[-1].url, args.model)
    return specs + ([gateway] if gateway else [])


def gateway_spec(host: str, port: int, scheduler_url: str, model: str = "") -> ServiceSpec | None:
    """The REST gateway (``python -m gateway``) in front of the scheduler service."""
    if importlib.util.find_spec("gateway") is None or \
            importlib.util.find_spec("gateway.__main__") is None:
        return None
    argv = python_module("gateway", "--scheduler", scheduler_url, "--host", host,
                         "--port", str(port), "--model", model)
    return ServiceSpec("gateway", argv, f"http://{host}:{port}", partial(_http_ok, host, port))


def _http_ok(host: str, port: int) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    supervisor = Supervisor(build_specs(args), report=partial(print, flush=True))
    signal.signal(signal.SIGTERM, _raise_interrupt)
    # SIGINT too: a shell starts a background job (`lenserve up &`) with SIGINT ignored, and
    # Python then installs no handler of its own, so `kill -INT` would stop nothing.
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        supervisor.start_all()
        for run_ in supervisor.running.values():
            print(f"{run_.spec.name:<10} {run_.spec.url}  (pid {run_.proc.pid})", flush=True)
        if not any(s.name == "gateway" for s in supervisor.specs):
            print("gateway    not started: no `gateway` package yet", flush=True)
        print("lenserve up: ready (Ctrl-C stops everything)", flush=True)
        while True:
            supervisor.poll()
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("lenserve up: stopping", flush=True)
    finally:
        supervisor.stop_all()
    return 0
