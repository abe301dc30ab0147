"""``evaluation/policies/tables.py``: sustained rates and throughput under a latency bound."""
import math

from evaluation.policies import tables


def run(policy, rate, p99_gap_s, tok_s):
    return {"policy": policy, "request_rate": rate,
            "summary": {"latency_bound_ms": {"p99": p99_gap_s * 1e3}, "output_throughput": tok_s}}


def test_throughput_under_a_bound_stops_at_the_first_rate_that_breaks_it():
    # (rate, P99 gap, tok/s): the 1.2 req/s run keeps the bound again, but a rate below it
    # broke it, so it does not count (as for sustained rates).
    pts = [(0.9, 2.0, 50.0), (0.3, 0.5, 30.0), (0.6, 0.8, 45.0), (1.2, 0.9, 60.0)]
    assert tables.throughput_at_bound(pts, 1.0) == 45.0
    assert tables.throughput_at_bound(pts, 2.5) == 60.0
    assert math.isnan(tables.throughput_at_bound(pts, 0.4))


def test_throughput_table_compares_with_vllm_and_marks_policies_that_never_keep_it():
    runs = [run("vllm", 0.3, 0.9, 20.0), run("vllm", 0.6, 3.0, 40.0),
            run("fluidinfer", 0.3, 0.4, 20.0), run("fluidinfer", 0.6, 0.6, 38.0),
            run("econoserve", 0.3, 5.0, 19.0)]
    lines = tables.throughput_bound_table(runs, [1.0])
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert rows["vllm"] == "| vllm | 20 | 1.00 |"
    assert rows["fluidinfer"] == "| fluidinfer | 38 | 1.90 |"
    assert rows["econoserve"] == "| econoserve | - | - |"


def nl_run(policy, rate, nl, p99_gap_s):
    return {"policy": policy, "request_rate": rate,
            "summary": {"normalized_latency_s_per_token": nl,
                        "latency_bound_ms": {"p99": p99_gap_s * 1e3}}}


def test_joint_rate_is_the_lower_of_the_two_sustained_rates():
    # vllm crosses the NL SLO at 1.5 req/s and the bound at 1.2: 1.2. "gaps" keeps the NL
    # SLO at the top rate tested and crosses the bound at 1.33. "slow" breaks the SLO at the
    # lowest rate already.
    runs = [nl_run("vllm", 1, 0.04, 0.5), nl_run("vllm", 2, 0.06, 3.0),
            nl_run("gaps", 1, 0.03, 0.5), nl_run("gaps", 2, 0.04, 2.0),
            nl_run("slow", 1, 0.2, 0.1), nl_run("slow", 2, 0.3, 0.1)]
    lines = tables.joint_table(runs, [(0.05, 1)])
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert rows["vllm"] == "| vllm | 1.20 | 1.00 |"
    assert rows["gaps"] == "| gaps | 1.33 | 1.11 |"
    assert rows["slow"] == "| slow | <1.00 | 0.83 |"
