"""``lenserve serve-scheduler`` / ``serve-executor`` / ``serve-kvmanager`` /
``serve-gateway`` / ``serve-router``: the services' own ``__main__`` parsers and entry points, under the one
command."""
from __future__ import annotations


def register(subparsers) -> None:
    from gateway import __main__ as gateway_main
    from services.executor import __main__ as executor_main
    from services.kvmanager import __main__ as kvmanager_main
    from services.router import __main__ as router_main
    from services.scheduler import __main__ as scheduler_main

    s = subparsers.add_parser("serve-scheduler", help="run the gRPC SchedulerService "
                              "(same flags as python -m services.scheduler)")
    scheduler_main.add_arguments(s)
    s.set_defaults(func=scheduler_main.serve)
    e = subparsers.add_parser("serve-executor", help="run the gRPC ExecutorService "
                              "(same flags as python -m services.executor)")
    executor_main.add_arguments(e)
    e.set_defaults(func=executor_main.serve)
    k = subparsers.add_parser("serve-kvmanager", help="run the gRPC KVManagerService, the host "
                              "KV tier of an executor service on this host (same flags as "
                              "python -m services.kvmanager)")
    kvmanager_main.add_arguments(k)
    k.set_defaults(func=kvmanager_main.serve)
    g = subparsers.add_parser("serve-gateway", help="run the OpenAI-compatible REST gateway in "
                              "front of a scheduler service (same flags as python -m gateway)")
    gateway_main.add_arguments(g)
    g.set_defaults(func=gateway_main.serve)
    r = subparsers.add_parser("serve-router", help="run the router: the scheduler's gRPC "
                              "contract in front of N scheduler replicas, placing each request "
                              "(same flags as python -m services.router)")
    router_main.add_arguments(r)
    r.set_defaults(func=router_main.serve)
