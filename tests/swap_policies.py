"""A test policy shared by the engine and kvmanager tests: vLLM plus random swaps."""
from __future__ import annotations

import random

from services.scheduler.policies.vllm import VllmPolicy


class RandomSwapPolicy(VllmPolicy):
    """vLLM plus random swaps: each iteration may swap a running request out and swapped
    ones back in, so swaps hit every phase of a request."""

    name = "test-random-swap"
    seed = 7

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rng = random.Random(self.seed)
        self.swapped: list = []

    def schedule(self, state, budget):
        output = state.new_output()
        running = list(state.running.values())
        if running and self.rng.random() < 0.3:
            victim = self.rng.choice(running)
            if victim.num_computed_tokens and state.swap_out(victim, output):
                self.swapped.append(victim)
                return output
        for req in list(self.swapped):
            if state.swap_in(req, output):
                self.swapped.remove(req)
        if output.swapped_in:
            return output
        return super().schedule(state, budget)

    def remove_request(self, request):
        if request in self.swapped:
            self.swapped.remove(request)
        super().remove_request(request)


class HeldUploadPolicy(RandomSwapPolicy):
    """Random swaps, and each swapped-in request kept out of the batch for ``hold`` iterations
    after its upload starts: an upload issued ahead of need, which the engine need not wait
    for until its request runs."""

    name = "test-held-upload"
    hold = 3

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.held: dict[str, int] = {}

    def schedule(self, state, budget):
        for rid in list(self.held):
            self.held[rid] -= 1
            if self.held[rid] <= 0 or rid not in state.running:
                del self.held[rid]
        hidden = {rid: state.running.pop(rid) for rid in self.held}
        try:
            output = super().schedule(state, budget)
        finally:
            state.running.update(hidden)
        for rid, _ in output.swapped_in:
            self.held[rid] = self.hold
        return output
