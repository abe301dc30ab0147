"""The serving core's side of the prefix cache's host tier (``prefix_host``): it runs the
copies the scheduler planned through the KV manager, the same calls as a request's swap.

Write-backs start at the end of a step and run beside the next iteration (one whose block
that iteration's schedule evicted is abandoned, or, if an upload took its copy, waited for
first). Per iteration: evicted host entries are freed first (a swap-out of the same iteration
may need their host blocks), then uploads start: one into a block a request of the iteration
reads (admitted as it was picked) is waited for before the iteration, the others run beside
it. All copies are waited for after it, before the next schedule (the earliest their device
blocks are handed out or read). A failed copy loses only the cache entry: a failed write-back
forgets the host entry, a failed upload un-indexes its device block (recomputed when next
needed) and ends the requests of the iteration that read it.
"""
from __future__ import annotations

import logging

from services.kvmanager.interface import KVManager, SwapHandle
from services.scheduler import prefix_host

logger = logging.getLogger(__name__)


class PrefixMoves:
    def __init__(self, state, kv_manager: KVManager):
        self.state, self.kv = state, kv_manager
        self._writes: list[tuple[str, SwapHandle]] = []
        self._uploads: list[tuple[str, int, SwapHandle]] = []

    def write_back(self) -> None:
        """End of a step: start writing back the blocks next to be evicted."""
        out = self.state.new_output()
        prefix_host.write_back(self.state, out)
        self._free(out.prefix_frees)
        self.start(out)

    def poll(self) -> None:
        """Before a schedule: write-backs that have landed are no longer in flight."""
        writing = self.state.prefix_host.writing
        if writing:
            done = {owner for owner, handle in self._writes if handle.done()}
            for block in [b for b, (owner, _) in writing.items() if owner in done]:
                del writing[block]

    def free(self, out) -> None:
        """Before an iteration's swaps: wait for write-backs it must not overwrite, and free
        the host entries its schedule evicted."""
        must_wait = self.state.prefix_host.must_wait
        for owner, handle in self._writes if must_wait else ():
            if owner in must_wait:
                self._wait_write(owner, handle)
        self._free(out.prefix_frees)

    def _free(self, owners: list[str]) -> None:
        for owner in owners:
            try:
                self.kv.free(owner)
            except Exception as exc:  # noqa: BLE001 - a lost cache entry, nothing more
                logger.error("could not free host prefix block %r: %s", owner, exc)

    def start(self, out) -> list[str]:
        """Start the iteration's copies; wait for the uploads a request it runs reads (one
        admitted as its blocks upload). Returns the requests whose blocks failed to land."""
        for owner, block in out.prefix_writebacks:
            try:
                self._writes.append((owner, self.kv.swap_out(owner, [block])))
            except Exception as exc:  # noqa: BLE001
                logger.error("prefix write-back of block %d failed: %s", block, exc)
                self.state.prefix_writeback_failed(owner)
        lost = []
        for owner, block in out.prefix_uploads:
            try:
                self._uploads.append((owner, block, self.kv.swap_in(owner, [block])))
            except Exception as exc:  # noqa: BLE001
                self._upload_failed(owner, block, exc)
                lost.append(block)
        return self._wait_read(out, lost) if out.prefix_uploads else []

    def _wait_read(self, out, lost: list[int]) -> list[str]:
        table = self.state.block_manager.block_table
        read: dict[int, list[str]] = {}
        for r, _ in out.scheduled:
            for b in table(r.request_id):
                read.setdefault(b, []).append(r.request_id)
        failed = [rid for b in lost for rid in read.get(b, ())]
        keep = []
        for owner, block, handle in self._uploads:
            if block not in read:
                keep.append((owner, block, handle))
                continue
            self.state.num_prefix_upload_waits += 1
            try:
                handle.wait()
            except Exception as exc:  # noqa: BLE001
                self._upload_failed(owner, block, exc)
                failed += read[block]
        self._uploads = keep
        return failed

    def finish(self) -> None:
        """Wait for the iteration's copies (before its deferred blocks are released)."""
        for owner, handle in self._writes:
            self._wait_write(owner, handle)
        self._free(self.state.prefix_host.abandoned)     # their blocks were overwritten
        for owner, block, handle in self._uploads:
            try:
                handle.wait()
            except Exception as exc:  # noqa: BLE001
                self._upload_failed(owner, block, exc)
        self._writes.clear()
        self._uploads.clear()

    def _wait_write(self, owner: str, handle: SwapHandle) -> None:
        try:
            handle.wait()
        except Exception as exc:  # noqa: BLE001
            logger.error("prefix write-back %r failed: %s", owner, exc)
            self.state.prefix_writeback_failed(owner)

    def _upload_failed(self, owner: str, block: int, exc: Exception) -> None:
        logger.error("prefix upload into block %d failed: %s", block, exc)
        self.state.prefix_upload_failed(block)
        try:
            if self.kv.holds(owner):    # a failed swap-in keeps the host copy: drop it
                self.kv.free(owner)
        except Exception as err:  # noqa: BLE001
            logger.error("could not free host prefix block %r: %s", owner, err)

    def clear(self) -> None:
        """Drop every host entry (between benchmark runs; no copy is in flight then)."""
        state = self.state
        for entry in state.prefix_host.entries.values():
            self.kv.free(entry.owner)
        state.num_free_host_blocks += len(state.prefix_host)
        state.prefix_host.entries.clear()

    def check(self) -> None:
        """Every host entry has its copy in the KV manager's pool."""
        for entry in self.state.prefix_host.entries.values():
            assert self.kv.holds(entry.owner), f"host prefix entry {entry.owner!r} has no copy"
