"""``lenserve up``: the whole system on this machine, one process per service: executor, the
kvmanager (host KV tier, with ``--swap-space``), predictor (embedded Qdrant, no external
server, seeded from the bundled ShareGPT sample), scheduler (gRPC, ``--scheduler-port``, 50051
by default: the SDK's ``Client("127.0.0.1:50051")``) and the REST gateway (``--port``, 8000 by
default). The scheduler runs the length-aware policy (``alise``) unless told otherwise. Prints
the URLs; a service that dies is reported and restarted; Ctrl-C, SIGTERM or SIGHUP stops
everything, and on Linux the services also stop when ``up`` itself is killed."""
from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import sys
import time
from functools import partial

from gateway.config import API_KEY_ENV
from lenserve.entrypoints.supervisor import ServiceSpec, Supervisor, python_module

GATEWAY_PORT = 8000       # what `lenserve serve` and the docs use
SCHEDULER_PORT = 50051    # the scheduler service's own default, which the SDK example dials
POLICY_ENV = "LENSERVE_POLICY"


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run executor, predictor, scheduler and the gateway "
                              "as local processes; restart any that dies", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="opt-tiny", help="model path, Hugging Face hub id (org/name) "
                                                    "or preset ('fake': no model)")
    p.add_argument("--policy", default=os.environ.get(POLICY_ENV, "alise"),
                   help=f"scheduling policy (default ${POLICY_ENV}, else alise: length-aware, "
                        "from the predictor's estimates)")
    p.add_argument("--policy-config", nargs="+", metavar="KEY=VALUE", default=[])
    p.add_argument("--port", type=int, default=GATEWAY_PORT,
                   help="the REST gateway's port (0: a free one)")
    p.add_argument("--scheduler-port", type=int, default=SCHEDULER_PORT,
                   help="the scheduler's gRPC port, for SDK clients (0: a free one)")
    p.add_argument("--api-key", action="append", default=[],
                   help=f"bearer key the gateway asks for (repeatable; also ${API_KEY_ENV}); "
                        "none: the API is open")
    p.add_argument("--num-gpu-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=0.0, metavar="GIB",
                   help="host KV tier: run a kvmanager service with this many GiB (0: none)")
    p.add_argument("--kv-int8", action="store_true", help="keep swapped KV as INT8")
    p.add_argument("--predictor-seed", default="bundled", metavar="bundled|FILE|none",
                   help="what the predictor starts from: the bundled 2,000 ShareGPT prompts "
                        "and reply lengths, a JSON-lines file of {prompt, output_len}, or "
                        "nothing (it learns from served requests only)")
    p.add_argument("--no-predictor", action="store_true",
                   help="no predictor service (length-aware policies then see defaults)")
    p.add_argument("--host", default="127.0.0.1", help="address every service binds")
    p.set_defaults(func=run)


class PortTaken(Exception):
    pass


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def claim_port(host: str, port: int, what: str, flag: str) -> int:
    """``port`` if nothing listens there now (0: a free one). Checked before anything starts:
    a gRPC server binds with SO_REUSEPORT, so a second scheduler on a taken port would start
    without complaint and share the port with whatever holds it."""
    if port == 0:
        return free_port(host)
    with socket.socket() as s:
        # As the servers bind (uvicorn and gRPC set SO_REUSEADDR): a port whose last server
        # just stopped, its connections in TIME_WAIT, is free to them, and so it is here.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen()
        except OSError as exc:
            raise PortTaken(f"{what} port {host}:{port} is taken ({exc.strerror}); "
                            f"stop what listens there or choose another with {flag}") from None
    return port


def grpc_health(target: str) -> bool:
    from services.rpc import check_health
    return check_health(target)


def _grpc_spec(name: str, module: tuple[str, ...], host: str, port: int, *flags) -> ServiceSpec:
    target = f"{host}:{port}"
    argv = python_module(*module, "--host", host, "--port", str(port), *flags)
    return ServiceSpec(name, argv, f"grpc://{target}", partial(grpc_health, target))


def build_specs(args: argparse.Namespace) -> list[ServiceSpec]:
    host = args.host
    # The published ports first: a taken one stops `up` before any service has started.
    scheduler_port = claim_port(host, args.scheduler_port, "scheduler", "--scheduler-port")
    gateway_port = claim_port(host, args.port, "gateway", "--port")
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
                                free_port(host), "--model", args.model,
                                "--seed-data", args.predictor_seed))
        predictor = specs[-1].url
    policy_config = ("--policy-config", *args.policy_config) if args.policy_config else ()
    specs.append(_grpc_spec("scheduler", ("services.scheduler",), host, scheduler_port, *model,
                            *sizes, "--executor", specs[0].url, *kvmanager,
                            "--predictor", predictor,
                            "--policy", args.policy, *policy_config))
    gateway = gateway_spec(host, gateway_port, specs[-1].url, args.model, api_keys(args))
    return specs + ([gateway] if gateway else [])


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = [*args.api_key, *os.environ.get(API_KEY_ENV, "").split(",")]
    return tuple(dict.fromkeys(k.strip() for k in keys if k.strip()))


def gateway_spec(host: str, port: int, scheduler_url: str, model: str = "",
                 keys: tuple[str, ...] = ()) -> ServiceSpec | None:
    """The REST gateway (``python -m gateway``) in front of the scheduler service; its keys
    travel in its environment, out of the argv that `ps` shows."""
    if importlib.util.find_spec("gateway") is None or \
            importlib.util.find_spec("gateway.__main__") is None:
        return None
    argv = python_module("gateway", "--scheduler", scheduler_url, "--host", host,
                         "--port", str(port), "--model", model)
    return ServiceSpec("gateway", argv, f"http://{host}:{port}", partial(_http_ok, host, port),
                       env=((API_KEY_ENV, ",".join(keys)),))


def _http_ok(host: str, port: int) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP (the terminal went away) stop everything as Ctrl-C does. SIGINT too:
    a shell starts a background job (`lenserve up &`) with SIGINT ignored, and Python then
    installs no handler of its own, so `kill -INT` would stop nothing."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _raise_interrupt)


def describe(supervisor: Supervisor, args: argparse.Namespace) -> list[str]:
    """One line per service (its URL and pid), then what the scheduler decides with."""
    lines = []
    for run_ in supervisor.running.values():
        spec, more = run_.spec, ""
        if spec.name == "gateway":
            keyed = dict(spec.env).get(API_KEY_ENV)
            more = "; API key required" if keyed else "; open, no API key"
        lines.append(f"{spec.name:<10} {spec.url}  (pid {run_.proc.pid}{more})")
    if "gateway" not in supervisor.running:
        lines.append("gateway    not started: no `gateway` package")
    if args.no_predictor:
        lines.append(f"policy     {args.policy}, without a predictor: length-aware policies "
                     "see default lengths")
    else:
        lines.append(f"policy     {args.policy}, predictor seeded from: {args.predictor_seed}")
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        specs = build_specs(args)
    except PortTaken as exc:
        print(f"lenserve up: {exc}", file=sys.stderr, flush=True)
        return 2
    supervisor = Supervisor(specs, report=partial(print, flush=True))
    stop_on_signals()
    try:
        supervisor.start_all()
        print("\n".join(describe(supervisor, args)), flush=True)
        print("lenserve up: ready (Ctrl-C stops everything)", flush=True)
        while True:
            supervisor.poll()
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("lenserve up: stopping", flush=True)
    except RuntimeError as exc:       # a service that could not start: say which, stop the rest
        print(f"lenserve up: {exc}; stopping", file=sys.stderr, flush=True)
        return 1
    finally:
        supervisor.stop_all()
    return 0
