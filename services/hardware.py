"""What this host's CPU can do, for the defaults that depend on it."""
from __future__ import annotations

import functools

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
