"""KVManagerConfig refuses bad values with a message naming the field."""
from __future__ import annotations

import dataclasses

import pytest

from services.kvmanager.config import GIB, KVManagerConfig


@pytest.mark.parametrize("kwargs,match", [
    ({"swap_space_gib": -1}, "swap_space_gib .* >= 0"),
    ({"swap_space_gib": float("nan")}, "swap_space_gib .*finite"),
    ({"swap_space_gib": float("inf")}, "swap_space_gib .*finite"),
    ({"swap_space_gib": "4"}, "swap_space_gib must be a number"),
    ({"swap_space_gib": True}, "swap_space_gib must be a number"),
    ({"swap_space_gib": 1, "num_workers": 0}, "num_workers"),
    ({"swap_space_gib": 1, "num_workers": 1.5}, "num_workers"),
    ({"swap_space_gib": 1, "int8": "yes"}, "int8"),
    ({"swap_space_gib": 1, "pin_memory": 1}, "pin_memory"),
])
def test_bad_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVManagerConfig(**kwargs)


def test_defaults_sizes_and_pinning():
    config = KVManagerConfig(1.5)
    assert (config.int8, config.pin_memory, config.num_workers) == (False, None, 1)
    assert config.swap_space_bytes == 3 * GIB // 2
    assert config.pin("cuda") and not config.pin("cpu")
    assert KVManagerConfig(0, pin_memory=False).pin("cuda") is False
    assert KVManagerConfig(0, pin_memory=True).pin("cpu") is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.int8 = True
