"""A policy that swaps one request out and back in, to test the swap path end to end."""
from services.scheduler.policies.vllm import VllmPolicy


class SwapOncePolicy(VllmPolicy):
    name = "test-swap-once"

    def schedule(self, state, budget):
        if state.iteration == 2:
            output = state.new_output()
            self.parked = next(iter(state.running.values()))
            assert state.swap_out(self.parked, output)
            return output
        if state.iteration == 4:
            output = state.new_output()
            assert state.swap_in(self.parked, output)
            return output
        return super().schedule(state, budget)
