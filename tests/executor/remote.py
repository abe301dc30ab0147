"""An executor behind a real gRPC server on a background event loop, for synchronous tests:
the engine under test talks to it through ``ExecutorClient`` exactly as a scheduler would."""
from __future__ import annotations

import asyncio
import threading

from services.executor.client import ExecutorClient
from services.executor.servicer import build_server, mark_serving


class ServedExecutor:
    """``worker``: the servicer's compute thread (``compute_thread``), when the test built
    the executor on it."""

    def __init__(self, executor, port: int = 0, worker=None):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._run(self._start(executor, port, worker))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **options) -> ExecutorClient:
        return ExecutorClient(f"grpc://{self.target}", **options)

    async def _start(self, executor, port: int, worker) -> int:
        self.server, bound, self.servicer = build_server(executor, f"127.0.0.1:{port}", worker)
        await self.server.start()
        await mark_serving(self.server)
        return bound

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def stop(self, grace_s: float | None = 0) -> None:
        """grace 0: in-flight calls are cut off, as when the process dies."""
        self._run(self.server.stop(grace=grace_s))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.servicer._worker.shutdown(wait=False)
        self.servicer._mover.shutdown(wait=False)


class Transports:
    """``wrap(executor)``: the executor itself (in-process) or a gRPC client of it."""

    def __init__(self, kind: str):
        self.kind = kind
        self._served: list[ServedExecutor] = []
        self._clients: list[ExecutorClient] = []

    def __call__(self, executor):
        if self.kind == "inprocess":
            return executor
        served = ServedExecutor(executor)
        self._served.append(served)
        self._clients.append(served.client())
        return self._clients[-1]

    def close(self) -> None:
        for client in self._clients:
            client.close()
        for served in self._served:
            served.stop()
