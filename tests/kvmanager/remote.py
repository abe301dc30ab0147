"""The KV manager as a service, for synchronous tests: a device pool behind a real executor
gRPC server, a kvmanager gRPC server whose core moves blocks with it over shared memory, and
the ``KVManagerClient`` a scheduler would use."""
from __future__ import annotations

import asyncio
import threading

from services.executor.client import ExecutorClient
from services.executor.interface import Executor
from services.kvmanager.client import KVManagerClient
from services.kvmanager.config import KVManagerConfig
from services.kvmanager.core import InProcessKVManager
from services.kvmanager.servicer import build_server, mark_serving
from tests.executor.remote import ServedExecutor


class MoverExecutor(Executor):
    """A mover (``export_blocks``/``import_blocks``) dressed as an executor, so that the
    executor service can serve its blocks."""

    def __init__(self, mover, info):
        self.mover, self.info = mover, info

    def model_info(self):
        return self.info

    def execute(self, batch):
        raise RuntimeError("this executor only moves blocks")

    def export_blocks(self, block_ids, out=None):
        return self.mover.export_blocks(block_ids, out)

    def import_blocks(self, block_ids, data):
        self.mover.import_blocks(block_ids, data)


class ServedKVManager:
    def __init__(self, core: InProcessKVManager, port: int = 0):
        self.core = core
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._run(self._start(port))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self, port: int) -> int:
        self.server, bound, self.servicer = build_server(self.core, f"127.0.0.1:{port}")
        await self.server.start()
        await mark_serving(self.server)
        return bound

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def stop(self) -> None:
        self._run(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.servicer.close()


class KVManagerStack:
    """executor service (over ``executor``) + kvmanager service + client; ``stop()`` ends
    them in reverse order."""

    def __init__(self, executor: Executor, config: KVManagerConfig, **client_options):
        self.executor = ServedExecutor(executor)
        self.mover = ExecutorClient(f"grpc://{self.executor.target}")
        core = InProcessKVManager(config, self.mover, self.mover.model_info(), device="cpu")
        self.kvmanager = ServedKVManager(core)
        self.client = KVManagerClient(f"grpc://{self.kvmanager.target}", **client_options)

    def stop(self) -> None:
        self.client.close()
        self.kvmanager.stop()
        self.mover.close()
        self.executor.stop()
