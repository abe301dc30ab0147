"""The serving core's KV copies: swap-outs and swap-ins started through the KV manager and
waited for only where an iteration needs them.

* A swap-out runs beside the iteration it was decided in; its device blocks stay reserved
  until ``finish`` (after that iteration), when they may be handed out again. Under a policy
  whose swap-outs come before the forward pass (``Policy.swap_outs_before_forward``, vLLM V0)
  the iteration waits for each one, and its blocks were free when the policy decided.
* A swap-in of a request the iteration runs (a policy that admits, then waits) is waited for
  before the iteration: an upload wait.
* A swap-in of a request the iteration does not run (a policy uploading ahead of need, ALISE's
  Alg. 2) is left in flight across iterations: it lands in the background. It is waited for
  only when its request is scheduled to run (an upload wait, counted as such) or when its
  device blocks change hands (the request preempted, swapped out, finished or aborted: the
  copy must not write into blocks another request now owns). The host blocks it reads stay
  reserved in the scheduler's accounting until it has landed.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from services.kvmanager.interface import KVManager, SwapHandle
from services.scheduler.output import SchedulerOutput
from services.scheduler.prefix_moves import PrefixMoves
from services.scheduler.request import RequestStatus
from services.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class EngineSwaps:
    def __init__(self, scheduler: Scheduler, kv_manager: KVManager | None,
                 fail: Callable[[str, str], object], prefix_moves: PrefixMoves | None = None):
        self.scheduler, self.kv_manager, self._fail = scheduler, kv_manager, fail
        # The prefix cache's host-tier copies: its host entries freed before the requests'
        # copies start, its own copies started after them and waited for in ``finish``.
        self.prefix_moves = prefix_moves
        self._outs: list[SwapHandle] = []
        # Uploads in flight: request -> (handle, the device blocks it writes).
        self.uploads: dict[str, tuple[SwapHandle, list[int]]] = {}
        # Swap-ins an iteration waited for before it ran, and those started ahead of need.
        self.num_upload_waits = self.num_uploads_ahead = 0

    def start(self, out: SchedulerOutput) -> list:
        """Settle the uploads this iteration needs, then start its own copies; returns the
        outputs of requests that failed."""
        failed = self._settle(out) if self.uploads else []
        moves = self.prefix_moves
        if moves is not None:
            moves.free(out)
        if out.swapped_out or out.swapped_in:
            failed += self._swap_requests(out)
        if moves is not None:
            failed += [self._fail(rid, "prefix upload failed") for rid in moves.start(out)]
        return self._drop_failed(out, failed)

    def _swap_requests(self, out: SchedulerOutput) -> list:
        if self.kv_manager is None:
            raise RuntimeError("the policy swapped KV but the engine has no KV manager")
        batch, waits, failed = {r.request_id for r, _ in out.scheduled}, [], []
        for is_out, rid, blocks in out.swap_sequence:
            try:
                if is_out:
                    # The token count keeps INT8 scales off the unwritten tail of a block.
                    tokens = self.scheduler.state.requests[rid].num_computed_tokens
                    self._outs.append(self.kv_manager.swap_out(rid, blocks, tokens))
                    if self.scheduler.state.swap_outs_before_forward:
                        self._wait_outs()   # its blocks may be written in this iteration
                    continue
                handle = self.kv_manager.swap_in(rid, blocks)
                if rid in batch:
                    waits.append((rid, handle))
                else:
                    self.uploads[rid] = (handle, list(blocks))
                    self.num_uploads_ahead += 1
            except Exception as exc:  # noqa: BLE001 - the state and the pool disagree: say so
                failed.append(self._fail(rid, f"swap-{'out' if is_out else 'in'} failed: {exc}"))
        self.num_upload_waits += len(waits)
        return failed + self._wait_ins(waits)

    @staticmethod
    def _drop_failed(out: SchedulerOutput, failed: list) -> list:
        """A request whose swap-in failed, or that was aborted meanwhile, has ended: it leaves
        the batch (and its waves)."""
        failed = [f for f in failed if f is not None]
        # (an abort while the iteration's uploads are copying also ends a request it runs)
        if not (failed or out.prefix_uploads) or not any(r.is_finished for r, _ in out.scheduled):
            return failed
        keep = [i for i, (r, _) in enumerate(out.scheduled) if not r.is_finished]
        new_index = {old: new for new, old in enumerate(keep)}
        out.scheduled = [out.scheduled[i] for i in keep]
        out.num_batched_tokens = sum(n for _, n in out.scheduled)
        if out.waves is not None:
            out.waves = [w for w in ([new_index[i] for i in wave if i in new_index]
                                     for wave in out.waves) if w]
        return failed

    def _settle(self, out: SchedulerOutput) -> list:
        """Reap landed uploads; wait for one whose request runs now or whose device blocks
        changed hands since the upload started."""
        batch = {r.request_id for r, _ in out.scheduled}
        state, failed = self.scheduler.state, []
        for rid, (handle, blocks) in list(self.uploads.items()):
            if handle.done():
                failed += self._land(rid)
                continue
            req = state.requests.get(rid)
            moved = (req is None or req.status is not RequestStatus.RUNNING
                     or state.block_manager.block_table(rid)[:len(blocks)] != blocks)
            if rid in batch or moved:
                self.num_upload_waits += 1
                failed += self._land(rid)
        return failed

    def _land(self, rid: str) -> list:
        handle, _ = self.uploads.pop(rid)
        return self._wait_ins([(rid, handle)])

    def finish(self) -> list:
        """After an iteration: wait for its swap-outs, reap the uploads that have landed (not
        waiting for the others) and hand back the blocks the copies no longer need."""
        failed = []
        for rid in [rid for rid, (h, _) in self.uploads.items() if h.done()]:
            failed += self._land(rid)
        self._wait_outs()
        if self.prefix_moves is not None:
            self.prefix_moves.finish()
        self.scheduler.release_swapped_blocks(
            in_flight=sum(len(blocks) for _, blocks in self.uploads.values()))
        return [f for f in failed if f is not None]

    def _wait_outs(self) -> None:
        for handle in self._outs:
            try:
                handle.wait()
            except Exception as exc:  # the copy is over either way; its swap-in will say why
                logger.error("a swap-out failed: %s", exc)
        self._outs.clear()

    def drain(self) -> list:
        """Wait for every copy (an idle iteration, or the engine is closing)."""
        failed = []
        for rid in list(self.uploads):
            failed += self._land(rid)
        return failed + self.finish()

    def _wait_ins(self, handles: list[tuple[str, SwapHandle]]) -> list:
        """Wait for each swap-in; a failed one ends its request with the reason."""
        failed = []
        for rid, handle in handles:
            try:
                handle.wait()
            except Exception as exc:  # noqa: BLE001 - the request ends with the reason
                failed.append(self._fail(rid, f"swap-in failed: {exc}"))
        return failed
