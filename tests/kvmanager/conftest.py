"""``make_manager``: every test that takes it runs against the in-process KV manager and
against the gRPC client of the kvmanager service (bytes through shared memory)."""
from __future__ import annotations

import pytest

from tests.kvmanager import helpers
from tests.kvmanager.remote import KVManagerStack, MoverExecutor

TRANSPORTS = ["inprocess", "grpc"]


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture
def make_manager(transport):
    stacks: list[KVManagerStack] = []

    def make(pool, host_blocks: int, int8: bool = False, **config):
        if transport == "inprocess":
            return helpers.make_manager(pool, host_blocks, int8, **config)
        manager, mover = helpers.make_manager(pool, host_blocks, int8, **config)
        manager.close()         # only its config and the mover are wanted
        stack = KVManagerStack(MoverExecutor(mover, helpers.model_info(pool)), manager.config)
        stacks.append(stack)
        assert stack.client.num_host_blocks == host_blocks
        return stack.client, mover

    yield make
    for stack in stacks:
        stack.stop()
