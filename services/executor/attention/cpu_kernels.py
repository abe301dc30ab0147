"""A C++ paged decode-attention kernel for CPUs, compiled on first use.

Decode attention on a CPU is bound by memory bandwidth: every step reads each running
sequence's whole K and V once. The SDPA path first copies a sequence's blocks into a contiguous
tensor (one extra write and read of the whole KV) and pays one dispatch per sequence and layer.
This kernel reads keys and values straight from the paged pool through the block table. A work
item is one sequence (split by KV heads when there are too few sequences to keep the threads
busy) and sweeps each of its blocks in address order; grouped query heads share that one pass.
Items run on the OpenMP threads torch itself uses (``torch.set_num_threads``).

It is built with ``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler and ninja,
both installed with the project) into ``$TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``); later processes load the cached library in milliseconds.
"""
from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <omp.h>
#include <cmath>
#include <limits>
#include <vector>

template <typename T>
static inline float to_f(T x) { return static_cast<float>(x); }

// Calls f(position, kv_head, row) for every cached position in [lo, seq_len) of a sequence and
// every KV head in [h0, h1), block by block through the table, each block in address order
// (blocks wholly before lo, outside a sliding window, are never touched).
template <typename T, typename F>
static inline void sweep(const T* __restrict cache, const int32_t* __restrict table,
                         int64_t lo, int64_t seq_len, int64_t bs, int64_t row, int64_t h0,
                         int64_t h1, int64_t D, F&& f) {
  for (int64_t t0 = (lo / bs) * bs; t0 < seq_len; t0 += bs) {
    const int64_t n = std::min(bs, seq_len - t0);
    const T* base = cache + static_cast<int64_t>(table[t0 / bs]) * bs * row;
    for (int64_t j = std::max<int64_t>(lo - t0, 0); j < n; ++j)
      for (int64_t kvh = h0; kvh < h1; ++kvh) f(t0 + j, kvh, base + j * row + kvh * D);
  }
}

// One work item: KV heads [h0, h1) of one sequence (each with its G query heads) against the
// sequence's keys lo..seq_len-1 (lo > 0 under a sliding window); softcap > 0 squashes each
// score to softcap * tanh(score / softcap). Every block's rows for those heads are read in
// address order, so the sweep over a block is one contiguous stream when the item covers all
// heads.
template <typename T>
static void decode_item(const T* __restrict q, const T* __restrict kc, const T* __restrict vc,
                        const int32_t* __restrict table, int64_t lo, int64_t seq_len, int64_t h0,
                        int64_t h1, int64_t G, int64_t Hkv, int64_t D, int64_t bs, float scale,
                        float softcap,
                        T* __restrict out, std::vector<float>& scores, std::vector<float>& qf,
                        std::vector<float>& acc) {
  const int64_t nq = (h1 - h0) * G;           // query heads in this item
  const int64_t L = seq_len - lo;            // keys in view; score t - lo of position t
  scores.resize(nq * L);
  qf.resize(nq * D);
  acc.assign(nq * D, 0.0f);
  for (int64_t h = 0; h < nq; ++h)
    for (int64_t d = 0; d < D; ++d) qf[h * D + d] = to_f(q[(h0 * G + h) * D + d]) * scale;
  const int64_t row = Hkv * D;
  // Pass 1: scores = q . k for every key.
  sweep(kc, table, lo, seq_len, bs, row, h0, h1, D, [&](int64_t t, int64_t kvh, const T* k) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = (kvh - h0) * G + g;
      const float* qh = qf.data() + h * D;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qh[d] * to_f(k[d]);
      if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
      scores[h * L + t - lo] = s;
    }
  });
  // Softmax per query head (normalised at the end).
  for (int64_t h = 0; h < nq; ++h) {
    float* sh = scores.data() + h * L;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < L; ++t) m = std::max(m, sh[t]);
    for (int64_t t = 0; t < L; ++t) sh[t] = std::exp(sh[t] - m);
  }
  // Pass 2: acc = sum_t p_t v_t.
  sweep(vc, table, lo, seq_len, bs, row, h0, h1, D, [&](int64_t t, int64_t kvh, const T* v) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = (kvh - h0) * G + g;
      const float p = scores[h * L + t - lo];
      float* ah = acc.data() + h * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) ah[d] += p * to_f(v[d]);
    }
  });
  for (int64_t h = 0; h < nq; ++h) {
    const float* sh = scores.data() + h * L;
    float z = 0.0f;
    for (int64_t t = 0; t < L; ++t) z += sh[t];
    const float inv = 1.0f / z;
    for (int64_t d = 0; d < D; ++d)
      out[(h0 * G + h) * D + d] = static_cast<T>(acc[h * D + d] * inv);
  }
}

template <typename T>
static void run_decode(const T* qp, const T* kp, const T* vp, const int32_t* tb,
                       const int32_t* lens, const int32_t* rw, int64_t S, int64_t H,
                       int64_t Hkv, int64_t D, int64_t bs, int64_t W, float scale,
                       int64_t window, float softcap, T* op) {
  const int64_t G = H / Hkv;
  // Whole sequences per item when there are enough of them to balance the threads; with few
  // sequences, split the KV heads so every thread still gets work.
  const int64_t threads = omp_get_max_threads();
  int64_t splits = 1;
  while (splits < Hkv && S * splits < 4 * threads) splits *= 2;
  splits = std::min(splits, Hkv);
  const int64_t per = (Hkv + splits - 1) / splits, items = S * splits;
#pragma omp parallel
  {
    std::vector<float> scores, qf, acc;
    // Dynamic schedule: context lengths differ a lot between sequences.
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < items; ++w) {
      const int64_t i = w / splits, h0 = (w % splits) * per, h1 = std::min(Hkv, h0 + per);
      if (h0 >= h1) continue;
      const int64_t r = rw[i];
      const int64_t lo = window > 0 ? std::max<int64_t>(0, lens[i] - window) : 0;
      decode_item<T>(qp + r * H * D, kp, vp, tb + i * W, lo, lens[i], h0, h1, G, Hkv, D, bs,
                     scale, softcap, op + r * H * D, scores, qf, acc);
    }
  }
}

// q, out: [num_tokens, H, D]; caches: [num_blocks, bs, Hkv, D]; rows[i]: the query row of
// decode sequence i; seq_lens[i]: its context length; tables: [num_seqs, max_blocks];
// window > 0: the query sees its last `window` keys only; softcap > 0: tanh-capped scores.
void paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor tables, torch::Tensor seq_lens, torch::Tensor rows,
                  double scale, int64_t window, double softcap, torch::Tensor out) {
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous(), "q and out must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(tables.is_contiguous() && tables.scalar_type() == torch::kInt32, "tables: int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && rows.scalar_type() == torch::kInt32,
              "seq_lens and rows: int32");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
              "q, caches and out must share a dtype");
  const int64_t S = seq_lens.size(0), H = q.size(1), D = q.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2), W = tables.size(1);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0, "head shapes do not match");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* rw = rows.data_ptr<int32_t>();
  const int32_t* tb = tables.data_ptr<int32_t>();
  for (int64_t i = 0; i < S; ++i)
    TORCH_CHECK(lens[i] >= 1 && (lens[i] + bs - 1) / bs <= W, "seq_len out of the block table");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_decode", [&] {
    run_decode<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                         v_cache.data_ptr<scalar_t>(), tb, lens, rw, S, H, Hkv, D, bs, W,
                         static_cast<float>(scale), window, static_cast<float>(softcap),
                         out.data_ptr<scalar_t>());
  });
}
"""

_lock = threading.Lock()
_module = None
_error: Exception | None = None


class KernelBuildError(RuntimeError):
    """The C++ kernel could not be compiled or loaded (no compiler, no ninja, ...)."""


def load() -> object:
    """The compiled extension module (built once per machine, then loaded from the cache)."""
    global _module, _error
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise KernelBuildError(str(_error)) from _error
        try:
            from torch.utils.cpp_extension import load_inline

            _module = load_inline(
                name="lenserve_cpu_attention_v4", cpp_sources=[_SOURCE],
                functions=["paged_decode"],
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as exc:  # compiler or ninja missing, build failure
            _error = exc
            detail = str(exc).strip().splitlines()[-3:]
            raise KernelBuildError(
                f"could not build the C++ CPU attention kernel ({type(exc).__name__}: "
                f"{' | '.join(detail)}); "
                "install a C++ compiler and ninja, or use --attention-backend torch") from exc
        return _module


def available() -> bool:
    try:
        load()
        return True
    except KernelBuildError as exc:
        log.warning("%s", exc)
        return False


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, rows: torch.Tensor,
                 scale: float, out: torch.Tensor, window: int = 0, softcap: float = 0.0) -> None:
    """Write into ``out[rows[i]]`` the attention of query row ``rows[i]`` over sequence ``i``'s
    ``seq_lens[i]`` keys (a decode row sees its whole context, or its last ``window`` keys)."""
    load().paged_decode(q, k_cache, v_cache, block_tables, seq_lens, rows, float(scale),
                        int(window), float(softcap), out)
