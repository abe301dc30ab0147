"""The analytical cost model, for hardware and models that were not profiled. Every number
it gives is an ESTIMATE: datasheet peaks scaled by efficiency factors chosen to land near
published vLLM measurements, not measured here.

An iteration is two phases, each bound by compute or by memory, whichever is slower:
* dense layers: 2 FLOPs per weight per fed token (+ the LM head per sampled sequence) against
  reading every weight once;
* attention: 4 FLOPs per (query, key) pair per head dimension and layer against reading the
  batch's KV once;
plus a fixed per-iteration overhead (kernel launches, sampling, host work)."""
from __future__ import annotations

from dataclasses import dataclass

from services.simulator.cost_model import CostModel
from services.simulator.features import IterationFeatures
from services.simulator.host_tier import HostLink
from services.simulator.shapes import ModelShape

GIB = 1 << 30


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: int
    peak_flops: float            # dense fp16/bf16 tensor-core FLOP/s (datasheet)
    memory_bandwidth: float      # bytes/s (datasheet)
    compute_efficiency: float = 0.6      # estimate
    attention_efficiency: float = 0.4    # estimate
    memory_efficiency: float = 0.75      # estimate
    overhead_s: float = 0.004            # estimate: per-iteration launch and host work
    host_link_bandwidth: float = 32e9    # bytes/s each way, PCIe x16 (datasheet)
    host_link_efficiency: float = 0.8    # estimate: pinned copies reach ~80% of PCIe peak
    host_copy_latency_s: float = 20e-6   # estimate: per swap copy (gather, launch, event)
    # The host beside the device (ESTIMATES of a typical machine for the setting): its DRAM
    # bandwidth and the cores the CPU-attention mode attends with.
    host_memory_bandwidth: float = 204.8e9   # 8 channels of DDR4-3200 (datasheet)
    host_cores: int = 32


HARDWARE: dict[str, Hardware] = {
    "a100-80g": Hardware("NVIDIA A100-SXM4-80GB", 80 * GIB, 312e12, 2.039e12,
                         host_link_bandwidth=32e9),      # PCIe 4.0 x16
    # FluidInfer's settings (report §6.1). RTX 4090: 165 TFLOP/s dense fp16 with fp32
    # accumulation, 1,008 GB/s, PCIe 4.0 x16 (datasheet). Four GPUs are modelled as one device
    # with four times the memory, compute, bandwidth and host links (tensor parallelism, each
    # GPU on its own x16 link); the all-reduces are folded into a larger per-iteration
    # overhead (ESTIMATE).
    # Hosts (ESTIMATES): one RTX 4090 in a 16-core desktop with two channels of DDR5-5600;
    # four in a 32-core workstation with eight channels of DDR4-3200; four A100s in a DGX A100
    # (two 64-core EPYC 7742, sixteen channels of DDR4-3200).
    "rtx4090": Hardware("NVIDIA GeForce RTX 4090", 24 * GIB, 165e12, 1.008e12,
                        host_link_bandwidth=32e9, host_memory_bandwidth=89.6e9, host_cores=16),
    "4x-rtx4090": Hardware("4x NVIDIA GeForce RTX 4090 (tensor parallel)", 96 * GIB, 4 * 165e12,
                           4 * 1.008e12, overhead_s=0.006, host_link_bandwidth=4 * 32e9),
    "4x-a100-40g": Hardware("4x NVIDIA A100-SXM4-40GB (tensor parallel)", 160 * GIB, 4 * 312e12,
                            4 * 1.555e12, overhead_s=0.006, host_link_bandwidth=4 * 32e9,
                            host_memory_bandwidth=409.6e9, host_cores=128),
    "h100": Hardware("NVIDIA H100-SXM5-80GB", 80 * GIB, 989e12, 3.35e12,
                     host_link_bandwidth=64e9),          # PCIe 5.0 x16
    # ALISE's setting (paper 001, Sec. 4.1): Tesla V100 32 GB (125 TFLOP/s fp16 tensor core,
    # 900 GB/s HBM2) on a PCIe 4.0 x16 host link as the paper states (a V100 itself links at
    # PCIe 3.0: the paper's figure is taken as given).
    "v100-32g": Hardware("NVIDIA Tesla V100-32GB", 32 * GIB, 125e12, 900e9,
                         host_link_bandwidth=32e9),      # PCIe 4.0 x16
}


def hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; choose one of {sorted(HARDWARE)}")
    return HARDWARE[name]


@dataclass(frozen=True)
class RooflineCostModel(CostModel):
    shape: ModelShape
    hw: Hardware

    def iteration_s(self, f: IterationFeatures) -> float:
        s, hw = self.shape, self.hw
        dense_flops = 2.0 * (s.dense_params * f.tokens + s.vocab_size * s.hidden_size * f.sampled)
        dense = max(dense_flops / (hw.peak_flops * hw.compute_efficiency),
                    s.weight_bytes / (hw.memory_bandwidth * hw.memory_efficiency))
        attn_flops = 4.0 * s.num_layers * s.num_heads * s.head_dim * f.attended
        kv_bytes = f.context * s.kv_bytes_per_token()
        attention = max(attn_flops / (hw.peak_flops * hw.attention_efficiency),
                        kv_bytes / (hw.memory_bandwidth * hw.memory_efficiency))
        return dense + attention + hw.overhead_s

    def describe(self) -> str:
        hw = self.hw
        return (f"roofline cost model (ESTIMATE) for {self.shape.name} on {hw.name}: efficiency "
                f"compute {hw.compute_efficiency}, attention {hw.attention_efficiency}, memory "
                f"{hw.memory_efficiency}, overhead {hw.overhead_s * 1e3:.1f} ms/iteration")


# KV bytes per second one core of lenserve's paged C++ CPU attention kernel reads on decode
# (``services/executor/attention/cpu_backend.py``): measured, CPU seconds of one thread, bf16,
# 32 heads of 128, 1 GiB of KV (past the last-level cache), on this project's Xeon build host.
CPU_ATTENTION_CORE_BYTES_PER_S = 6.5e9
# Share of the DRAM bandwidth a streaming read reaches (ESTIMATE).
HOST_MEMORY_EFFICIENCY = 0.8


def host_attention_bytes_per_s(hw: Hardware) -> float:
    """KV bytes per second the host's cores attend over (CPU-attention mode, ESTIMATE): the
    kernel's measured rate per core on every core, capped by the host's DRAM bandwidth."""
    return min(hw.host_cores * CPU_ATTENTION_CORE_BYTES_PER_S,
               hw.host_memory_bandwidth * HOST_MEMORY_EFFICIENCY)


# Memory traffic of the INT8 codec per device byte (ESTIMATE): quantizing reads the blocks
# twice (the channel ranges, then the codes) and writes a code per element; dequantizing reads
# the codes and writes the elements once. 2.5 bytes for a 16-bit KV cache.
INT8_CODEC_TRAFFIC = 2.5


def host_link(hw: Hardware) -> HostLink:
    """The device-host link of the simulated host KV tier (ESTIMATE)."""
    bandwidth = hw.host_link_bandwidth * hw.host_link_efficiency
    codec = hw.memory_bandwidth * hw.memory_efficiency / INT8_CODEC_TRAFFIC
    return HostLink(bandwidth, bandwidth, hw.host_copy_latency_s,
                    f"ESTIMATE: {hw.host_link_efficiency:.0%} of the PCIe peak of "
                    f"{hw.host_link_bandwidth / 1e9:.0f} GB/s each way; INT8 codec at "
                    f"{codec / 1e9:.0f} GB/s of device memory traffic",
                    int8_codec_bytes_per_s=codec,
                    host_attention_bytes_per_s=host_attention_bytes_per_s(hw))


def kv_capacity_blocks(shape: ModelShape, hw: Hardware, block_size: int,
                       utilization: float = 0.9, activation_reserve: int = 2 * GIB) -> int:
    """Blocks left for KV (ESTIMATE): ``utilization`` of memory minus weights and a reserve
    for activations, as vLLM sizes its pool."""
    free = int(hw.memory_bytes * utilization) - shape.weight_bytes - activation_reserve
    blocks = free // (shape.kv_bytes_per_token() * block_size)
    if blocks < 1:
        raise ValueError(f"{shape.name} ({shape.weight_bytes / GIB:.1f} GiB of weights) leaves no "
                         f"KV memory on {hw.name}")
    return blocks
