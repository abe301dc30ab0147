"""What an API client is told when a request fails after its parameters were accepted: what
failed, in words, with a status to match. Never the exception's own text: a gRPC error's repr
names hosts, ports and call internals, and an executor's failure carries whatever the model
code raised. The whole detail goes to the gateway's log instead, beside the request id."""
from __future__ import annotations

import logging

from gateway.errors import APIError

log = logging.getLogger(__name__)


class GenerationFailed(Exception):
    """The scheduler ended a request with an error after it started."""


def status_name(exc: BaseException) -> str | None:
    """The gRPC status of an RPC error (``UNAVAILABLE``...), read by name so the gateway does
    not depend on the transport's types; None for anything else."""
    code = getattr(exc, "code", None)
    if not callable(code):
        return None
    try:
        return getattr(code(), "name", None)
    except Exception:  # noqa: BLE001 - a foreign .code() is just not a status
        return None


def describe_failure(exc: BaseException) -> APIError:
    """The client's view of ``exc``: 504 when the scheduler let a deadline pass, 503 when it
    cannot be reached (or went away mid-request: retrying later may succeed), 500 when the
    engine failed the request, 502 for anything else the scheduler answered."""
    status = status_name(exc)
    if status == "DEADLINE_EXCEEDED" or isinstance(exc, TimeoutError):
        return APIError(504, "the scheduler did not answer in time", code="scheduler_timeout")
    if status in ("UNAVAILABLE", "CANCELLED") or isinstance(exc, ConnectionError):
        return APIError(503, "scheduler unavailable; retry later", code="scheduler_unavailable")
    if isinstance(exc, GenerationFailed):
        return APIError(500, "generation failed in the engine; the request cannot go on",
                        code="generation_failed")
    return APIError(502, "the scheduler failed the request", code="scheduler_error")


def failure(exc: BaseException, request_id: str) -> APIError:
    """``describe_failure``, with the detail the client does not see logged."""
    err = describe_failure(exc)
    log.warning("request %s failed (%d %s): %r", request_id, err.status, err.code, exc)
    return err
