import dataclasses

import pytest

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies import make_policy
from services.scheduler.policy import PolicyConfig, parse_policy_config


@dataclasses.dataclass(frozen=True)
class Opts(PolicyConfig):
    rate: float = 1.0
    queues: int = 4
    swap: bool = True
    mode: str = "a"


def test_values_are_converted_to_field_types():
    got = parse_policy_config(Opts, ["rate=0.5", "queues=8", "swap=false", "mode=b"])
    assert got == Opts(0.5, 8, False, "b")


def test_dashes_and_dicts_are_accepted():
    assert parse_policy_config(Opts, {"queues": "2"}).queues == 2
    assert parse_policy_config(Opts, ["rate=2"]).rate == 2.0


@pytest.mark.parametrize("items, match", [
    (["nope=1"], "unknown policy-config key"),
    (["queues=many"], "expected int"),
    (["swap=maybe"], "expected bool"),
    (["queues"], "key=value"),
])
def test_bad_entries_are_refused_clearly(items, match):
    with pytest.raises(ValueError, match=match):
        parse_policy_config(Opts, items)


def test_make_policy_names_the_policy_in_the_error():
    with pytest.raises(ValueError, match="policy 'vllm': unknown policy-config key"):
        make_policy("vllm", SchedulerConfig(num_gpu_blocks=8, block_size=4, max_model_len=16),
                    ["x=1"])
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope", SchedulerConfig(num_gpu_blocks=8, block_size=4, max_model_len=16))
