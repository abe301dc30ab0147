"""EconoServe's prompt tasks (paper §3.3.1), a mixin of ``EconoServePolicy``: PTs fill the
token budget each iteration within the KV reserved for them, or beyond it when no GT waits and
the PT's whole allocation fits what the GTs leave."""
from __future__ import annotations

from services.scheduler.output import SchedulerOutput
from services.scheduler.request import Request
from services.scheduler.state import SchedulerState


class PromptsMixin:
    # Provided by the policy: config, options, model, pts, gts, prefilling, keys, lender_of,
    # reserved_blocks, waiting_cap, _key.

    def _admit_prompts(self, state: SchedulerState, output: SchedulerOutput, tokens: int) -> None:
        bm = state.block_manager
        held = self._distinct_blocks(bm, list(self.prefilling))   # a shared block once
        waiting = self._waiting_kv(bm) if self.gts else 0
        while tokens > 0 and self.pts:
            if waiting and held + waiting >= self.waiting_cap:
                return      # enough prompts wait for their GT allocation already
            req = self._pick_prompt(bm, tokens, held, first=not self.prefilling and
                                    not output.scheduled)
            if req is None:
                return
            state.prefix_start(req)             # admit shares its cached prefix
            if not state.admit(req, req.num_tokens):
                return
            self.pts.remove(req)
            held += bm.num_blocks_of(req.request_id)
            # Without chunking an oversized prompt runs whole, alone. A cached prefix was
            # claimed by the admission: only the rest is fed.
            n = req.num_tokens - req.num_computed_tokens
            if self.config.enable_chunked_prefill:
                n = min(n, tokens)
            self.prefilling[req.request_id] = req
            self.keys[req.request_id] = self._key(req, 0, req.num_tokens)
            output.add(req, n)
            tokens -= n

    def _waiting_kv(self, bm) -> int:
        """Blocks of the GTs waiting for their allocation that have never decoded (prompt
        KV), a block they share (a cached prefix) once; kept up to date at queue changes
        would cost more than this sum, which runs once per iteration over the waiting GTs."""
        ids = [r.request_id for r in self.gts.ordered() if r.request_id not in self.lender_of]
        return self._distinct_blocks(bm, ids)

    @staticmethod
    def _distinct_blocks(bm, ids: list[str]) -> int:
        if bm.prefix is not None:
            return len({b for rid in ids for b in bm.block_table(rid)})
        return sum(bm.num_blocks_of(rid) for rid in ids)

    def _prompt_fits(self, bm, req: Request, held: int) -> bool:
        """PTs live in the reserve (the paper's "small amount of KVC reserved for adding
        PTs"): ``held`` counts the prompts being prefilled, not the prefilled ones waiting as
        GTs (their KV is the GTs' now), so prompts do not wait beside free blocks. A prompt
        larger than the whole reserve may use it alone. Beyond it a prompt starts only when
        no GT waits and its whole allocation fits the unreserved free KV, so that prompts
        whose GTs could not start do not take the KV the queued GTs wait for."""
        free = bm.num_free_blocks
        # Blocks of its cached prefix that other requests hold already cost nothing new.
        need = bm.blocks_for(req.num_tokens) - bm.num_held_of(bm.match_prefix(req.token_ids))
        if need <= free and (held + need <= self.reserved_blocks or held == 0):
            return True
        if self.gts:
            return False
        if self.pooled:      # its GT, and those of the prompts in prefill, fit the projection
            self._pool_plan(bm)
            prof = self._prof
            for other in self.prefilling.values():
                prof = self._pool_add(other, bm, 0, prof)
            return self._pool_slack(req, bm, 0, prof) >= 0
        target = bm.blocks_for(self.model.target_tokens(req))
        return target <= free - self.reserved_blocks

    def _pick_prompt(self, bm, tokens: int, held: int, first: bool) -> Request | None:
        head = self.pts.head()
        uncached = head.num_tokens - head.num_cached_tokens
        if uncached <= tokens or self.config.enable_chunked_prefill or first:
            # The head fits the budget, is chunked into it, or runs whole and alone.
            return head if self._prompt_fits(bm, head, held) else None
        fit = self.pts.largest_fitting(tokens)        # binary search: fill the budget
        return fit if fit is not None and self._prompt_fits(bm, fit, held) else None

