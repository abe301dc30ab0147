"""``--kv-int8`` and the policy's ``kv_int8`` option are one setting, and it acts."""
from __future__ import annotations

import pytest

from services.scheduler.engine_core import EngineCore
from services.scheduler.wiring import EngineConfig, engine_parts


@pytest.mark.parametrize("flag, option, int8", [(False, (), False), (True, (), True),
                                                (False, ("kv_int8=true",), True),
                                                (True, ("kv_int8=false",), True)])
def test_the_flag_and_the_option_both_turn_the_host_tier_int8(flag, option, int8):
    cfg = EngineConfig(model="opt-tiny", policy="alise", policy_config=option, kv_int8=flag,
                       swap_space_gib=0.01, num_gpu_blocks=32)
    assert cfg.kv_int8 is int8
    engine = EngineCore(**engine_parts(cfg))
    try:
        assert engine.kv_manager.stats().int8 is int8
    finally:
        engine.close()


@pytest.mark.parametrize("kw", [{"kv_int8": True}, {"policy_config": ("kv_int8=1",)}])
def test_int8_without_a_host_tier_is_refused_rather_than_ignored(kw):
    with pytest.raises(ValueError, match="swap_space_gib > 0"):
        EngineConfig(model="opt-tiny", policy="alise", **kw)


def test_up_starts_the_kvmanager_int8_for_the_policy_option():
    from lenserve.commands.up import _kv_int8

    class Args:
        policy, policy_config, kv_int8 = "alise", ["kv_int8=true"], False
    assert _kv_int8(Args()) and not _kv_int8(type("A", (Args,), {"policy_config": []})())
