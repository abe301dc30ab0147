"""Workloads for ``lenserve bench``: public datasets and traces turned into timed requests."""
from lenserve.workloads.arrivals import synthetic_offsets, trace_offsets
from lenserve.workloads.datasets import (
    DATASET_NAMES,
    bundled_sharegpt_path,
    default_trace_path,
    load_samples,
)
from lenserve.workloads.sampling import ArrivalConfig, SampleConfig, build_workload, sample_requests
from lenserve.workloads.types import BenchRequest, Sample, Workload

__all__ = [
    "DATASET_NAMES",
    "ArrivalConfig",
    "BenchRequest",
    "Sample",
    "SampleConfig",
    "Workload",
    "build_workload",
    "bundled_sharegpt_path",
    "default_trace_path",
    "load_samples",
    "sample_requests",
    "synthetic_offsets",
    "trace_offsets",
]
