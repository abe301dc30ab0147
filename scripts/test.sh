#!/usr/bin/env bash
# Install lenserve with its test extras on a fresh machine and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# torch first, at the pinned version; one already installed (e.g. the CPU build) is kept.
# From PyPI, Linux gets the CUDA build (see the README for the CPU-only index).
$PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[test]'
$PY scripts/gen_protos.py --check
# Triton kernels run in the interpreter when there is no GPU.
if ! $PY -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  export TRITON_INTERPRET=1
fi
# The Celery tests need Redis; start the local one if it is not answering.
if command -v redis-cli >/dev/null && ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null || true
fi
exec $PY -m pytest -q -p no:cacheprovider "$@"
