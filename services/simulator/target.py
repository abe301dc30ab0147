"""What is simulated: a model shape, its cost model and its KV pool, from a measured profile
or from the roofline (hardware + model shape)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from services.simulator.cost_model import CostModel
from services.simulator.profile_file import load_profile
from services.simulator.host_tier import HostLink
from services.simulator.overheads import Overheads
from services.simulator.overheads import load as load_overheads
from services.simulator.roofline import RooflineCostModel, hardware, host_link, kv_capacity_blocks
from services.simulator.shapes import ModelShape, model_shape


@dataclass(frozen=True)
class SimTarget:
    shape: ModelShape
    cost: CostModel
    num_gpu_blocks: int
    block_size: int
    notes: tuple[str, ...]     # what the numbers rest on, estimates named as such
    link: HostLink | None = None    # the host KV tier's copies (None: none measured)
    device: str | None = None  # where a measured profile ran ("cpu", "cuda"); None: roofline
    # The scheduler's CPU time and the predictor's latency, measured on the real engine
    # (services/simulator/overheads.py); None: not charged.
    overheads: Overheads | None = None


def from_profile(path: str, model: str | None = None) -> SimTarget:
    """The profile's model with a cost model fitted to its points. ``model``, when given,
    must be the profiled one: a profile of another model would time the wrong network."""
    profile = load_profile(path)
    if model is not None and model != profile.shape.name:
        raise ValueError(f"profile {path!r} was measured on {profile.shape.name!r}, not "
                         f"{model!r}; profile {model} with `lenserve profile` first")
    cost, report = profile.fit()
    meta = profile.meta or {}
    notes = (f"modelling {profile.shape.name} in {profile.shape.dtype} on {profile.device}: "
             f"measured profile {path} ({profile.device} {meta.get('device_name', '')}, "
             f"{meta.get('date', 'undated')})",
             cost.describe(), str(report),
             f"KV pool: {profile.num_gpu_blocks} blocks of {profile.block_size} (the real "
             f"executor's default on that device)")
    link, charged = profile.host_link(), load_overheads()
    if link is not None and charged is not None and profile.device == "cpu":
        # The INT8 codec's rate was measured on this kind of device with the overheads.
        link = dataclasses.replace(link, int8_codec_bytes_per_s=charged.int8_codec_bytes_per_s)
    if link is not None:
        notes += (link.describe(),)
    return SimTarget(profile.shape, cost, profile.num_gpu_blocks, profile.block_size,
                     notes + _overhead_notes(charged), link, profile.device, charged)


def _overhead_notes(charged: Overheads | None, path: str | None = None) -> tuple[str, ...]:
    if charged is None:
        why = "--overheads none" if path == "none" else "no measured overheads file"
        return (f"scheduler CPU time and predictor latency: not charged ({why}), which "
                f"flatters the ESTIMATE of length-aware policies",)
    return (f"scheduler CPU time per iteration and predictor latency charged (an ESTIMATE for "
            f"the simulated machine's host CPU): {charged.source}",)


def resolve_dtype(dtype: str, device: str) -> str:
    """What ``--dtype`` becomes on ``device`` in the real executor: the rule of
    ``services.executor.models.loader.resolve_dtype``, restated here because that module
    imports torch, which a simulation otherwise never loads (seconds of start-up)."""
    from services.hardware import cpu_has_native_bf16

    if dtype != "auto":
        return dtype
    native = device_type(device) == "cuda" or cpu_has_native_bf16()
    return "bfloat16" if native else "float32"


def device_type(device: str) -> str:
    return device.split(":", 1)[0]


def precision_mismatch(target: SimTarget, dtype: str, device: str) -> str | None:
    """One line when the measured profile ran in another dtype or on another device than the
    run being modelled: its times are then those of the profile's setting, not the asked one
    (an opt-125m CPU profile in float32 predicted 4x the E2E latency of a bfloat16 run)."""
    if target.device is None:        # the roofline takes its device and dtype from its flags
        return None
    asked = (resolve_dtype(dtype, device), device_type(device))
    measured = (target.shape.dtype, device_type(target.device))
    if asked == measured:
        return None
    how = "" if dtype != "auto" else " (--dtype auto here)"
    return (f"note: the profile was measured in {measured[0]} on {measured[1]}, but "
            f"{asked[0]} on {asked[1]}{how} is asked: simulated times are those of "
            f"{measured[0]} on {measured[1]}; run `lenserve profile --model "
            f"{target.shape.name} --dtype {asked[0]} --device {device}` to model it")


def from_roofline(hardware_name: str, shape_name: str, block_size: int = 16) -> SimTarget:
    hw, shape = hardware(hardware_name), model_shape(shape_name)
    blocks = kv_capacity_blocks(shape, hw, block_size)
    cost, link, charged = RooflineCostModel(shape, hw), host_link(hw), load_overheads()
    notes = (cost.describe(),
             f"KV pool (ESTIMATE): {blocks} blocks of {block_size} = {blocks * block_size} "
             f"tokens: 90% of {hw.memory_bytes / 2**30:.0f} GiB minus "
             f"{shape.weight_bytes / 2**30:.1f} GiB of weights and 2 GiB for activations",
             link.describe(), *_overhead_notes(charged))
    return SimTarget(shape, cost, blocks, block_size, notes, link, overheads=charged)


def with_blocks(target: SimTarget, num_gpu_blocks: int | None) -> SimTarget:
    if num_gpu_blocks is None:
        return target
    return dataclasses.replace(
        target, num_gpu_blocks=num_gpu_blocks,
        notes=target.notes + (f"KV pool set by --num-gpu-blocks: {num_gpu_blocks}",))


def with_overheads(target: SimTarget, path: str | None) -> SimTarget:
    """``path``: another overheads file to charge; ``none``: charge nothing; None: as is."""
    if path is None:
        return target
    charged = None if path == "none" else load_overheads(path)
    if charged is None and path != "none":
        raise ValueError(f"no overheads file at {path!r}")
    keep = tuple(n for n in target.notes if "scheduler CPU time" not in n)
    return dataclasses.replace(target, overheads=charged,
                               notes=keep + _overhead_notes(charged, path))
