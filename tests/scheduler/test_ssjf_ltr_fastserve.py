"""The non-preemptive length-ordered baselines and FastServe's skip-join MLFQ."""
from sched_helpers import add, make_request, make_scheduler, scheduled, step

from services.scheduler.request import RequestStatus


def test_ssjf_admits_the_shortest_prediction_first_and_never_preempts_for_rank():
    s = make_scheduler("ssjf", max_num_seqs=1)
    long, short = add(s, make_request("long", 4, 40, predicted_output_len=40),
                      make_request("short", 4, 40, predicted_output_len=2))
    out, _ = step(s)
    assert list(scheduled(out)) == ["short"]
    add(s, make_request("tiny", 4, 40, predicted_output_len=1))
    step(s)
    assert short.status is RequestStatus.RUNNING         # non-preemptive
    assert long.status is RequestStatus.WAITING


def test_ltr_promotes_a_request_that_waited_past_the_threshold():
    s = make_scheduler("ltr", max_num_seqs=1, policy_config=("starvation_s=5",))
    long = make_request("long", 4, 3, predicted_output_len=100)
    add(s, long)
    order = []
    for i in range(40):
        add(s, make_request(f"s{i}", 4, 2, predicted_output_len=2))
        out, _ = step(s, now=float(i))
        order += list(scheduled(out))
    assert "long" in order and order.index("long") < 20
    assert s.policy.num_promotions >= 1


def test_fastserve_skip_join_and_demotion():
    s = make_scheduler("fastserve", max_model_len=128,
                       policy_config=("base_quantum_s=0.05", "num_queues=4"))
    small, big = add(s, make_request("small", 2, 40), make_request("big", 120, 4))
    jobs = s.policy.jobs
    # Prefill of 120 tokens ~ 120 * 0.02/32 = 0.075 s > 0.05: it skips the top queue.
    assert jobs["small"].level == 0 and jobs["big"].level == 1
    for _ in range(4):
        step(s)
    assert jobs["small"].level >= 1                    # used its quantum: demoted
