"""The serving core's side of streamed requests (FluidInfer): requests whose KV stays in the
host tier run in an iteration beside the resident ones (see
``services/executor/streaming.py``).

Streaming needs an executor that can read the host tier (``attach_stream_source``) and a KV
manager that exposes its blocks (``stream_source``: an in-process full-precision pool, or the
simulator's bookkeeping). Where either is missing, or a stream cannot be prepared or run, the
reason is logged and the scheduler falls back to resident-only schedules
(``SchedulerState.can_stream`` False): requests whose KV is on the host are then swapped back
in as before, and none is lost.
"""
from __future__ import annotations

import logging

from services.scheduler.output import SchedulerOutput
from services.scheduler.state import SchedulerState

logger = logging.getLogger(__name__)


def setup_streaming(state: SchedulerState, executor, kv_manager, mode: str = "link") -> None:
    """Connect the executor to the host tier's blocks when both can; else say why not. An
    executor with a cost model also lends its token-wise cost curve (``token_seconds``).
    ``mode``: where streamed waves' attention runs (the policy's ``stream_mode``): ``link``
    (uploaded to the device), ``cpu`` (on the host CPU, where the KV lives) or ``free`` (the
    simulator's infinitely fast link)."""
    state.token_seconds = getattr(executor, "token_seconds", None)
    if kv_manager is None:
        state.stream_off_reason = "no host KV tier"
        return
    try:
        source = kv_manager.stream_source()
    except Exception as exc:  # noqa: BLE001 - a remote manager that cannot answer
        source, why = None, f"the KV manager cannot expose its blocks ({exc})"
    else:
        why = "the KV manager cannot expose its blocks (INT8 or remote)"
    attach = getattr(executor, "attach_stream_source", None)
    if attach is None:
        why = "the executor cannot read the host tier (a remote executor)"
    if source is None or attach is None:
        state.stream_off_reason = why
        return
    set_mode = getattr(executor, "set_stream_mode", None)
    if set_mode is not None:
        set_mode(mode)      # the simulator: charges each mode's work
    elif mode != "link" and getattr(executor, "stream_staged", False):
        state.stream_off_reason = (f"stream_mode={mode}: attention over the host tier on the "
                                   f"CPU beside a GPU executor is not built")
        return
    attach(source)
    state.can_stream, state.stream_off_reason = True, ""
    link = getattr(kv_manager, "stream_link_bytes_per_s", 0.0)
    if set_mode is not None and link:
        link = executor.stream_bytes_per_s()
    block = getattr(kv_manager, "device_block_bytes", 0)
    state.stream_blocks_per_s = link / block if link and block else 0.0


def disable_streaming(state: SchedulerState, why: str) -> None:
    if state.can_stream:
        logger.warning("streaming from the host tier is off, falling back to resident-only "
                       "schedules: %s", why)
    state.can_stream, state.stream_off_reason = False, why


def prepare_streams(state: SchedulerState, kv_manager,
                    out: SchedulerOutput) -> dict[str, list[int]]:
    """Each streamed request's host blocks, grown for its new tokens. On any failure streaming
    is turned off and the streamed requests leave this iteration (they stay swapped)."""
    tables, n_of = {}, {r.request_id: n for r, n in out.scheduled}
    try:
        for rid in out.streamed:
            req = state.requests[rid]
            tables[rid] = kv_manager.stream_blocks(rid, req.num_computed_tokens + n_of[rid])
    except Exception as exc:  # noqa: BLE001 - the reason is logged, nothing is lost
        disable_streaming(state, f"could not prepare a streamed request: {exc}")
        drop_streamed(out)
        return {}
    return tables


def drop_streamed(out: SchedulerOutput) -> None:
    """Remove the streamed requests from the iteration (renumbering its waves)."""
    streamed = out.streamed
    keep = [i for i, (r, _) in enumerate(out.scheduled) if r.request_id not in streamed]
    index = {old: new for new, old in enumerate(keep)}
    out.scheduled = [out.scheduled[i] for i in keep]
    out.num_batched_tokens = sum(n for _, n in out.scheduled)
    if out.waves is not None:
        waves = [[index[i] for i in w if i in index] for w in out.waves]
        out.waves = [w for w in waves if w] if sum(1 for w in waves if w) > 1 else None
    streamed.clear()
