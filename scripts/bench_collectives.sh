#!/usr/bin/env bash
# Same-run comparison of collective bandwidth: dspine's NCCL communicator (dspine-bench
# collectives under mpirun) and torch.distributed's NCCL (torchrun), same payload and GPUs.
# Usage: scripts/bench_collectives.sh BUILD_DIR [RANKS] [BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:?build directory}"; RANKS="${2:-2}"; BYTES="${3:-$((1 << 30))}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --allow-run-as-root --bind-to none -np "$RANKS" "$BUILD_DIR/bin/dspine-bench" collectives \
  --bytes "$BYTES"
if python3 -c 'import torch, sys; sys.exit(torch.cuda.device_count() < '"$RANKS"')' 2>/dev/null; then
  python3 -m torch.distributed.run --standalone --nproc_per_node "$RANKS" \
    scripts/torch_collectives.py --bytes "$BYTES"
else
  echo "torch with $RANKS CUDA devices not found: no same-run torch figures"
fi
