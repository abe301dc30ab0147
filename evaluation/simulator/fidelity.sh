#!/usr/bin/env bash
# The simulator's fidelity on this machine: profile the executor, run the real engine, replay
# the same workload in the simulator with that profile, compare (evaluation/simulator/fidelity.py).
#   evaluation/simulator/fidelity.sh OUTDIR [RATES] [MAX_MODEL_LEN]
# One intra-op thread everywhere (the profile and the real runs must see the same machine);
# run it on a quiet machine: another job on the cores changes iteration times by 2x.
set -euo pipefail
out=$1 rates=${2:-0.75,1.5,4} len=${3:-128}
data=${SHAREGPT:-../shared/data/sharegpt_v3_first_turn.jsonl.gz}
mkdir -p "$out"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
common=(--dataset-name sharegpt --dataset-path "$data" --num-prompts 200 --max-model-len "$len"
        --sweep-rates "$rates" --seed 0 --disable-tqdm)
lenserve profile --model opt-125m --device cpu --dtype float32 --threads 1 \
  --out "$out/profile.json" --disable-tqdm 2>&1 | tee "$out/profile.log"
lenserve bench --backends lenserve:vllm,lenserve:orca --model opt-125m "${common[@]}" \
  --result-json "$out/real.json" > "$out/real.log" 2>&1
lenserve simulate --profile "$out/profile.json" --backends sim:vllm,sim:orca --predictor none \
  "${common[@]}" --result-json "$out/sim.json" > "$out/sim.log" 2>&1
python3 "$(dirname "$0")/fidelity.py" "$out/real.json" "$out/sim.json" | tee "$out/fidelity.txt"
