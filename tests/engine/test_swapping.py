"""Swapping through a small host KV tier, end to end on the engine: block accounting on the
device and the host holds after every step, a full host pool makes the policy recompute
instead, and tokens are identical whether or not a request was swapped (the fake executor's
next token is a hash of the context read back from the KV blocks, so a lost or misplaced
block changes the output)."""
import random

import pytest
from engine_helpers import make_engine, replay, run_to_completion

from lenserve_contract.sampling_params import SamplingParams
from services.scheduler.policies import POLICIES
from tests.swap_policies import HeldUploadPolicy, RandomSwapPolicy

# The fake executor's host block is 64 bytes (block_size 4, int64 ids, K and V): 2 KiB hold
# 32 blocks, too few for every preempted request, so refusals happen too.
SMALL_HOST_GIB = 2048 / 2**30


def workload(seed: int, n: int = 20):
    rng = random.Random(seed)
    for i in range(n):
        prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 24))]
        out_len = rng.randint(1, 30)
        yield f"r{i}", prompt, SamplingParams(max_tokens=out_len, ignore_eos=True), out_len


def run(policy: str, seed: int, **config):
    engine = make_engine(policy, num_gpu_blocks=20, max_model_len=64, max_num_batched_tokens=24,
                         max_num_seqs=6, **config)
    return replay(engine, workload(seed)), engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_swaps_keep_tokens_and_accounting(monkeypatch, seed):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    reference, _ = run("vllm", seed)
    tokens, engine = run(RandomSwapPolicy.name, seed, swap_space_gib=SMALL_HOST_GIB)
    assert tokens == reference
    kv = engine.kv_manager.stats()
    assert kv.bytes_swapped_in > 0 and kv.num_swapped_requests == 0
    assert kv.num_free_host_blocks == kv.num_host_blocks == engine.stats().num_host_blocks


@pytest.mark.parametrize("policy", ["alise", "fastserve", "fluidinfer", "alise-fluid"])
@pytest.mark.parametrize("seed", [0, 1])
def test_swapping_policies_on_a_small_host_tier_give_vllms_tokens(policy, seed):
    reference, _ = run("vllm", seed)
    tokens, engine = run(policy, seed, swap_space_gib=SMALL_HOST_GIB)
    assert tokens == reference
    assert engine.kv_manager.stats().num_swapped_requests == 0


def test_a_full_host_tier_falls_back_to_recompute(monkeypatch):
    monkeypatch.setitem(POLICIES, RandomSwapPolicy.name, RandomSwapPolicy)
    reference, _ = run("vllm", 3)
    tiny = 3 * 64 / 2**30                      # three host blocks
    tokens, engine = run(RandomSwapPolicy.name, 3, swap_space_gib=tiny)
    assert tokens == reference
    assert engine.scheduler.state.swap_refusals > 0


def test_uploads_ahead_copy_beside_the_iteration_and_a_failed_one_ends_its_request(monkeypatch):
    """fluidinfer uploads a request one iteration before running it: the engine runs that
    iteration beside the copy and waits for it after, never running a request whose upload
    has not landed; an upload that fails ends its request with the reason, and nothing else.
    Forced on: this KV manager copies on the CPU, where ``auto`` waits for uploads instead."""
    reference, _ = run("vllm", 0)
    engine = make_engine("fluidinfer", num_gpu_blocks=20, max_model_len=64,
                         max_num_batched_tokens=24, max_num_seqs=6, swap_space_gib=SMALL_HOST_GIB,
                         policy_config=("upload_ahead=true",))
    assert not engine.scheduler.state.copies_overlap
    events, in_flight, doomed = [], set(), []
    kv, executor = engine.kv_manager, engine.executor
    real_swap_in, real_execute = kv.swap_in, executor.execute

    def swap_in(rid, blocks):
        handle = real_swap_in(rid, blocks)
        real_wait = handle.wait
        events.append(("swap_in", rid))
        in_flight.add(rid)
        if not doomed:
            doomed.append(rid)              # the first upload fails

        def wait():
            real_wait()
            events.append(("wait", rid))
            in_flight.discard(rid)
            if rid == doomed[0]:
                raise RuntimeError("host copy corrupted")
        handle.wait = wait
        return handle

    def execute(batch):
        running = {s.request_id for s in batch.sequences}
        assert not running & in_flight, "an iteration read KV whose upload had not landed"
        events.append(("execute", tuple(sorted(running))))
        return real_execute(batch)

    monkeypatch.setattr(kv, "swap_in", swap_in)
    monkeypatch.setattr(executor, "execute", execute)
    done = {}
    for step, (rid, prompt, params, _) in enumerate(workload(0)):
        engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params)
        if step % 2 == 0:
            done.update((o.request_id, o) for o in engine.step() if o.finished)
    done.update(run_to_completion(engine))
    # Uploads waited for only after an iteration ran between their start and their wait.
    starts = {}
    beside = []
    for i, (kind, what) in enumerate(events):
        if kind == "swap_in":
            starts[what] = i
        elif kind == "wait" and any(e[0] == "execute" for e in events[starts[what]:i]):
            beside.append(what)
    assert len(beside) > 3
    failed = done.pop(doomed[0])
    assert "swap-in failed: host copy corrupted" in failed.error
    assert {rid: out.outputs[0].token_ids for rid, out in done.items()} == {
        rid: toks for rid, toks in reference.items() if rid != doomed[0]}
    assert kv.stats().num_swapped_requests == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_an_upload_ahead_spans_iterations_and_is_waited_for_only_when_its_request_runs(
        monkeypatch, seed):
    """Copies that land two iterations after they start, for requests the policy
    runs three iterations after their upload: the copies land in the background while other
    requests run, and the engine waits (and counts a wait) only for one whose request must
    run, or whose blocks change hands (swapped out again), first. Waiting for every upload
    at the end of the iteration it was issued in stalled on each one."""
    monkeypatch.setitem(POLICIES, HeldUploadPolicy.name, HeldUploadPolicy)
    reference, _ = run("vllm", seed)
    engine = make_engine(HeldUploadPolicy.name, num_gpu_blocks=20, max_model_len=64,
                         max_num_batched_tokens=24, max_num_seqs=6,
                         swap_space_gib=SMALL_HOST_GIB)
    kv, calls, stalls, idle = engine.kv_manager, [0], [], [False]
    real_swap_in, real_schedule = kv.swap_in, engine.scheduler.schedule

    class SlowUpload:       # the real copy underneath, so a stale block changes the tokens
        def __init__(self, rid, blocks):
            self.rid, self.handle = rid, real_swap_in(rid, blocks)
            self.lands_at = calls[0] + 2

        def done(self):
            return calls[0] >= self.lands_at and self.handle.done()

        def wait(self):
            if calls[0] < self.lands_at and not idle[0]:     # an idle engine loses nothing
                stalls.append(self.rid)
            self.handle.wait()

    def schedule(now):
        calls[0] += 1
        out = real_schedule(now)
        idle[0] = out.is_empty
        return out

    monkeypatch.setattr(kv, "swap_in", SlowUpload)
    monkeypatch.setattr(engine.scheduler, "schedule", schedule)
    assert replay(engine, workload(seed)) == reference
    stats = engine.stats()
    assert stats.num_uploads_ahead > 10
    assert len(stalls) <= stats.num_upload_waits
    assert len(stalls) < 0.25 * stats.num_uploads_ahead, (len(stalls), stats.num_uploads_ahead)


@pytest.mark.parametrize("seed", [0, 1])
def test_vllm_v0_swap_mode_gives_vllms_tokens(seed):
    reference, _ = run("vllm", seed)
    tokens, engine = run("vllm-v0", seed, swap_space_gib=SMALL_HOST_GIB,
                         policy_config=("preemption_mode=swap",))
    assert tokens == reference
    kv = engine.kv_manager.stats()
    assert kv.bytes_swapped_in > 0 and kv.num_swapped_requests == 0


def test_econoserve_guests_moved_to_the_host_tier_keep_their_tokens():
    # Predictions 4x too small: guests outlive the blocks they borrowed and are moved out
    # through the KV manager, then come back; a lost or misplaced block changes the tokens.
    moves = swapped_in = 0
    for seed in range(4):
        engine = make_engine("econoserve", num_gpu_blocks=40, max_model_len=64,
                             max_num_batched_tokens=24, swap_space_gib=8 * SMALL_HOST_GIB,
                             policy_config=("padding_ratio=0", "lend_scope=host"))
        reference, _ = run("vllm", seed)
        for rid, prompt, params, n in workload(seed):
            engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params,
                               predicted_output_len=max(n // 4, 1))
        done = run_to_completion(engine)
        assert {rid: out.outputs[0].token_ids for rid, out in done.items()} == reference
        moves += engine.scheduler.policy.num_guest_moves
        swapped_in += engine.kv_manager.stats().bytes_swapped_in
    assert moves > 0 and swapped_in > 0
