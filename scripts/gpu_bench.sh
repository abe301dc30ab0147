#!/usr/bin/env bash
# The executor's GPU checks and benchmarks in one go (run from the repository root on a CUDA
# machine whose python3 has the project's dependencies):
#
#   bash scripts/gpu_bench.sh OUT_DIR [PHASES]
#
# PHASES, comma-separated (default tests,executor,attention):
#   tests      the executor's tests on the GPU (graphs, fused kernels, HF token identity)
#   executor   bench-executor: smollm-360m and opt-125m, bf16, graphs vs eager vs transformers
#   baseline   bench-executor of another checkout given in BASELINE (the code before a change)
#   attention  bench-attention's default sweep and smollm-360m's shapes
#   tune       scripts/tune_attention.py over candidate kernel launch shapes
#   serve      lenserve bench at saturation: lenserve vs hf-cb, smollm-360m, ShareGPT (needs
#              SHAREGPT=path to sharegpt_v3_first_turn.jsonl.gz)
# Logs and JSON land in OUT_DIR.
set -uo pipefail
out=${1:?usage: scripts/gpu_bench.sh OUT_DIR [PHASES]}
phases=",${2:-tests,executor,attention},"
mkdir -p "$out"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
has() { [[ $phases == *",$1,"* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton",
triton.__version__, "transformers", transformers.__version__)' | tee -a "$out/gpu.txt"

if has tests; then
  skip=()   # the gRPC servicer's tests need grpcio-health-checking, not a GPU
  $py -c 'import grpc_health' 2>/dev/null || skip=(--ignore=tests/executor/test_servicer.py)
  $py -m pytest -q -p no:cacheprovider tests/executor tests/kvmanager/test_cuda.py "${skip[@]}" \
    2>&1 | tee "$out/tests.log" | tail -15
fi
if has executor; then
  for model in smollm-360m opt-125m; do
    $py -m lenserve.cli bench-executor --model "$model" --dtype bfloat16 \
      --batch-sizes 1,8,32,128 --repeats 20 --compare-eager --hf-peer \
      --json "$out/executor_$model.json" 2>&1 | tee "$out/executor_$model.log" | tail -8
  done
fi
if has baseline; then
  # The command module alone: an older checkout's CLI may import more than this needs.
  PYTHONPATH="${BASELINE:?BASELINE=checkout}:$PYTHONPATH" $py -P -c 'import argparse, sys
from lenserve.commands import bench_executor as b
p = argparse.ArgumentParser(); b.register(p.add_subparsers())
a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))' bench-executor \
    --model smollm-360m --dtype bfloat16 --batch-sizes 1,8,32,128 --repeats 20 \
    --json "$out/baseline_smollm-360m.json" 2>&1 | tee "$out/baseline.log" | tail -8
fi
if has attention; then
  $py -m lenserve.cli bench-attention --dtype bfloat16 2>&1 | tee "$out/attention.log"
  $py -m lenserve.cli bench-attention --dtype bfloat16 --num-heads 15 --num-kv-heads 5 \
    --head-dim 64 --shapes decode:1x512 decode:32x512 decode:128x512 decode:1x8192 \
    2>&1 | tee -a "$out/attention.log"
fi
if has tune; then
  timeout "${TUNE_TIMEOUT:-300}" $py scripts/tune_attention.py --json "$out/tune.json" 2>"$out/tune.err" | tee "$out/tune.log"
fi
if has serve; then
  $py -m lenserve.cli bench --model smollm-360m --device cuda --dtype bfloat16 \
    --backends lenserve:vllm,hf-cb --dataset-name sharegpt --dataset-path "${SHAREGPT:?}" \
    --num-prompts "${NUM_PROMPTS:-400}" --max-num-seqs 256 --disable-tqdm \
    --result-json "$out/serve.json" 2>&1 | tee "$out/serve.log" | tail -30
fi
