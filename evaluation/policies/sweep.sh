#!/usr/bin/env bash
# The simulated policy sweep of the README's "Policies at paper scale" (estimates): one
# `lenserve simulate` per policy, so each JSON stays small and the embedded predictor's
# vectors are shared by the runs of one process. Usage:
#   evaluation/policies/sweep.sh OUTDIR DATASET NUM_PROMPTS NUM_GPU_BLOCKS RATES [MODEL_SHAPE] [POLICIES]
# e.g. evaluation/policies/sweep.sh results/raw/sharegpt sharegpt 2000 1024 2,4,5,6,7,8,10,12,16
# --repeat-dataset cycles the dataset when NUM_PROMPTS exceeds it (Alpaca's 1k records).
# PREDICTOR=oracle gives the length-aware policies the true lengths instead of the embedded
# predictor (the mechanism without prediction error). SWAP_SPACE=GIB gives every run a host KV
# tier of that size (the link's time from the roofline, an estimate), KV_INT8=1 compresses it.
set -euo pipefail
out=$1 dataset=$2 num=$3 blocks=$4 rates=$5 shape=${6:-llama-2-7b}
policies=${7:-vllm,orca,sarathi,fastserve,fluidinfer,oracle,ssjf,ltr,alise,econoserve}
case $dataset in
  sharegpt) path=/work/shared/data/sharegpt_v3_first_turn.jsonl.gz ;;
  alpaca) path=/work/shared/data/alpaca_data_1k_random_subset.json ;;
  *) echo "dataset: sharegpt or alpaca" >&2; exit 2 ;;
esac
path=${DATASET_PATH:-$path}
mkdir -p "$out"
sim() {   # policy predictor jct-slo
  nice -n 19 lenserve simulate --hardware a100-80g --model-shape "$shape" \
    --backends "sim:$1" --predictor "$2" --dataset-name "$dataset" --dataset-path "$path" \
    --num-prompts "$num" --repeat-dataset --num-gpu-blocks "$blocks" --sweep-rates "$rates" --seed 0 \
    --jct-slo "$3" --swap-space "${SWAP_SPACE:-0}" ${KV_INT8:+--kv-int8} --disable-tqdm --result-json "$out/$1.json" --plot "$out/$1.png" \
    > "$out/$1.txt" 2> "$out/$1.err"
}
# vllm first: its lightest-load run gives the JCT SLO's tp and tg for every policy.
[ -s "$out/vllm.json" ] || sim vllm none 2
slo=$(python - "$out/vllm.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
s = min(runs, key=lambda r: r["request_rate"])["summary"]["jct_slo"]
print(f"{s['scale']:g}:{s['tp_ms']:.3f}:{s['tg_ms']:.3f}")
PY
)
echo "JCT SLO scale:tp_ms:tg_ms = $slo" > "$out/jct_slo.txt"
for p in ${policies//,/ }; do
  [ "$p" = vllm ] && continue
  [ -s "$out/$p.json" ] && continue
  case $p in ssjf|ltr|alise|econoserve) pred=${PREDICTOR:-embedded} ;; *) pred=none ;; esac
  sim "$p" "$pred" "$slo"
done
