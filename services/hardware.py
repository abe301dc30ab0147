"""What this host's CPU can do, for the defaults that depend on it."""
from __future__ import annotations

import functools
import os

# The help text of every --dtype flag whose default is "auto" (resolved by the executor's
# loader, `services.executor.models.loader.resolve_dtype`).
DTYPE_AUTO_HELP = ("auto: bfloat16 on a GPU or on a CPU with native bf16 arithmetic "
                   "(AVX512-BF16 or AMX), float32 on other CPUs")


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True where the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX), so that bf16
    matrix products can beat fp32 ones; elsewhere bf16 operands are converted to fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def keep_torch_single_threaded() -> None:
    """Run the calling thread's torch operations on that thread alone, without an OpenMP
    team of its own. Call it first thing in every thread of a process that touches torch
    but is not the process's compute thread (a predictor's, a retrain's, a copy thread).

    Why: GNU OpenMP (the runtime torch ships on Linux) gives every thread that starts a
    parallel region a team of its own, and its threads live as long as that thread. Once the
    process has more OpenMP threads than CPUs, every team's threads stop spin-waiting between
    parallel regions and sleep instead, so each of the forward pass's thousands of regions
    pays a wake-up. Measured on a 2-core CPU (opt-125m, bfloat16, 200 requests decoding): one
    idle thread that had once run a matrix product made each step 1.43x as long, the C++
    decode attention 2x; the same thread confined by this call cost nothing. Hence also: a
    process builds its model on the thread that then runs it.

    Here the thread's OpenMP and MKL thread counts (both per-thread settings) are set to 1,
    so that its operations run inline and start no team: in every OpenMP runtime loaded, since
    a library may bring its own beside torch's. Without OpenMP or MKL, nothing is done."""
    import torch

    torch.get_num_threads()       # torch's own per-thread set-up first, or it would undo ours
    for set_count in _thread_count_setters():
        set_count(1)


def _thread_count_setters() -> list:
    """This thread's thread-count setters: ``omp_set_num_threads`` of every OpenMP runtime
    loaded in this process (torch's, and others a library brought: scikit-learn ships a
    libgomp of its own) and MKL's C ``MKL_Set_Num_Threads_Local`` where torch carries MKL
    (the lower-case name is MKL's Fortran entry, which takes a pointer). Read anew each call:
    a runtime may load after the first."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {parts[5].strip() for parts in map(lambda line: line.split(None, 5), f)
                     if len(parts) == 6 and parts[5].startswith("/")}
    except OSError:       # no /proc: not Linux, where torch's OpenMP is not GNU's
        return []
    wanted = {("libgomp", "libiomp5", "libomp"): "omp_set_num_threads",
              ("libtorch_cpu",): "MKL_Set_Num_Threads_Local"}
    setters = []
    for path in sorted(paths):
        for prefixes, symbol in wanted.items():
            if os.path.basename(path).startswith(prefixes):
                try:
                    setters.append(getattr(ctypes.CDLL(path), symbol))
                except (OSError, AttributeError):
                    pass
    return setters
