"""The KV manager's interface types and errors to and from ``kvmanager.proto`` and gRPC status
codes: one place, so that the servicer and the client agree."""
from __future__ import annotations

import grpc

from lenserve_contract.errors import InvalidRequestError
from lenserve_contract.proto import kvmanager_pb2 as pb
from services import rpc
from services.kvmanager.interface import HostPoolFullError, KVStats, RequestNotHeldError

NUM_BLOCKS_KEY = "lenserve-num-blocks"
NUM_FREE_KEY = "lenserve-num-free"


class KVManagerUnavailableError(RuntimeError):
    """The kvmanager service could not be reached or failed; the message says which."""


class SwapFailedError(RuntimeError):
    """A copy of the kvmanager failed (its message is the kvmanager's)."""


def stats_to_proto(s: KVStats) -> pb.KVStats:
    return pb.KVStats(num_host_blocks=s.num_host_blocks,
                      num_free_host_blocks=s.num_free_host_blocks,
                      host_bytes_used=s.host_bytes_used, int8=s.int8,
                      num_swapped_requests=s.num_swapped_requests,
                      bytes_swapped_out=s.bytes_swapped_out, bytes_swapped_in=s.bytes_swapped_in,
                      link_bytes_out=s.link_bytes_out, link_bytes_in=s.link_bytes_in)


def stats_from_proto(m: pb.KVStats) -> KVStats:
    return KVStats(m.num_host_blocks, m.num_free_host_blocks, m.host_bytes_used, m.int8,
                   m.num_swapped_requests, m.bytes_swapped_out, m.bytes_swapped_in,
                   m.link_bytes_out, m.link_bytes_in)


def pool_full_metadata(exc: HostPoolFullError) -> tuple[tuple[str, str], ...]:
    return ((NUM_BLOCKS_KEY, str(exc.num_blocks)), (NUM_FREE_KEY, str(exc.num_free)))


def describe(error: BaseException) -> str:
    return str(error) or type(error).__name__


def error_from_rpc(err: grpc.RpcError, request_id: str, target: str) -> Exception:
    """The interface's exception for a failed call (what the in-process manager raises)."""
    code, details = err.code(), err.details() or ""
    meta = dict(err.trailing_metadata() or ())
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(details, field=meta.get(rpc.FIELD_METADATA_KEY, ""))
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and NUM_BLOCKS_KEY in meta:
        return HostPoolFullError(request_id, int(meta[NUM_BLOCKS_KEY]), int(meta[NUM_FREE_KEY]))
    if code == grpc.StatusCode.NOT_FOUND and request_id:
        return RequestNotHeldError(request_id, details)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return ValueError(details)
    return KVManagerUnavailableError(f"kvmanager at {target}: {code.name}: {details}")
