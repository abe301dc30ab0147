"""Multi-turn ShareGPT: each turn's prompt extends the previous turn's prompt by its reply and
the new turn (the prefix a cache can serve); a turn is due only after the previous reply and
its think time; a system prompt goes in front of every prompt of any workload."""
import gzip
import json

import pytest

from lenserve.workloads.datasets import load_conversations
from lenserve.workloads.followups import Arrivals
from lenserve.workloads.multiturn import (
    MultiTurnConfig,
    conversations,
    ideal_hit_tokens,
    multiturn_requests,
    shared_prefix,
    system_prompt_ids,
    timed,
)
from lenserve.workloads.types import BenchRequest
from services.executor.fake import CharTokenizer

SHARED = "/work/shared/data/sharegpt_v3_conversations_first17671.jsonl.gz"


def _record(*turns):
    roles = ["human", "gpt"] * len(turns)
    return {"id": "x", "conversations": [{"from": r, "value": v} for r, v in zip(roles, turns)]}


def test_each_turn_carries_the_conversation_so_far_and_the_real_reply_length():
    convs = conversations([_record("hello there", "hi, how can I help?", "tell me more", "sure thing")])
    (group,) = multiturn_requests(convs, CharTokenizer(), MultiTurnConfig(2, think_time_s=0))
    first, second = group
    assert bytes(first.prompt_token_ids).decode() == "User: hello there\nAssistant:"
    assert first.output_len == len("hi, how can I help?") and first.after is None
    assert bytes(second.prompt_token_ids).decode() == (
        "User: hello there\nAssistant: hi, how can I help?\nUser: tell me more\nAssistant:")
    assert second.prompt_token_ids[:first.prompt_len] == first.prompt_token_ids
    assert second.after == first.request_id and second.output_len == len("sure thing")


def test_a_fixed_output_len_forces_every_turn_and_keeps_the_real_reply_in_the_history():
    convs = conversations([_record("hello there", "hi, how can I help?", "tell me more", "sure thing")])
    (group,) = multiturn_requests(convs, CharTokenizer(),
                                  MultiTurnConfig(2, think_time_s=0, fixed_output_len=5))
    assert [t.output_len for t in group] == [5, 5]     # --output-len, as for other datasets
    assert b"hi, how can I help?" in bytes(group[1].prompt_token_ids)


def test_a_conversation_stops_at_its_first_turn_past_the_limits_or_out_of_order():
    convs = conversations([_record("a" * 10, "b" * 10, "c" * 500, "d" * 10, "e" * 5, "f" * 5),
                           {"conversations": [{"from": "gpt", "value": "x"}]}])
    assert len(convs) == 1 and len(convs[0]) == 3
    cfg = MultiTurnConfig(1, max_prompt_len=100, think_time_s=0)
    (group,) = multiturn_requests(convs, CharTokenizer(), cfg)
    assert len(group) == 1
    with pytest.raises(ValueError, match="only 1 turns"):
        multiturn_requests(convs, CharTokenizer(), MultiTurnConfig(2, max_prompt_len=100))


def test_a_follow_up_is_due_after_the_previous_reply_plus_its_think_time():
    a = BenchRequest("a", (1,), 1, arrival_offset=1.0)
    b = BenchRequest("b", (1, 2), 1, arrival_offset=1.0, after="a", think_s=2.5)
    c = BenchRequest("c", (3,), 1, arrival_offset=2.0)
    arrivals = Arrivals([a, b, c])
    assert arrivals.pop_due(1.5) == [(a, 1.0)]
    assert arrivals.pop_due(10.0) == [(c, 2.0)]      # b waits for a, however late it is
    assert arrivals and arrivals.next_time() is None
    arrivals.finished("a", 11.0)
    assert arrivals.pop_due(13.0) == [] and arrivals.pop_due(13.5) == [(b, 13.5)]
    assert not arrivals


def test_conversations_start_at_the_rate_and_turns_stay_in_order():
    convs = load_conversations()                       # the bundled sample
    groups = multiturn_requests(convs, CharTokenizer(), MultiTurnConfig(40, seed=3))
    workload = timed("mt", groups, rate=2.0, seed=3)
    assert len(workload.requests) == 40
    assert sum(len(g) > 1 for g in groups) > 0
    # Every follow-up's predecessor is in the workload and arrives no later.
    offset = {r.request_id: r.arrival_offset for r in workload.requests}
    assert all(offset[r.after] <= r.arrival_offset for r in workload.requests if r.after)


def test_a_system_prompt_is_shared_by_every_prompt_and_counts_in_the_ideal_hits():
    tok = CharTokenizer()
    system = system_prompt_ids(tok, 32, seed=1)
    assert len(system) == 32 and system == system_prompt_ids(tok, 32, seed=1)
    reqs = shared_prefix([BenchRequest(f"r{i}", (40 + i,) * 20, 4) for i in range(4)], system)
    assert all(r.prompt_token_ids[:32] == system for r in reqs)
    total, hits = ideal_hit_tokens([r.prompt_token_ids for r in reqs], 16)
    assert total == 4 * 52 and hits == 3 * 32


@pytest.mark.skipif(not __import__("os").path.exists(SHARED), reason="shared data not here")
def test_the_full_conversation_file_gives_many_turns_with_a_real_ideal_hit_rate():
    with gzip.open(SHARED, "rt") as f:
        records = [json.loads(next(f)) for _ in range(300)]
    groups = multiturn_requests(conversations(records), CharTokenizer(),
                                MultiTurnConfig(300, max_prompt_len=4000, max_total_len=8000))
    prompts = [r.prompt_token_ids for g in groups for r in g]
    total, hits = ideal_hit_tokens(prompts, 16)
    assert sum(len(g) > 1 for g in groups) > 20 and 0.2 < hits / total < 1
