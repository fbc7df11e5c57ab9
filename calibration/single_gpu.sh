#!/usr/bin/env bash
# Calibrate one GPU and time real training steps on it, in one go.
#
#   bash calibration/single_gpu.sh OUT_DIR [BUDGET_S]
#
# Interference of co-located kernels: calibration/single_gpu_interference.sh (about 4 minutes).
#
# Writes OUT_DIR/compute/{compute.csv,metadata.json} (the full single-GPU compute grid, stopped
# cleanly after BUDGET_S seconds, default 290), OUT_DIR/validate/measured.csv (the GPU runs of
# `perfmodel validate`, predicted with the bundled profile) and OUT_DIR/log.txt. Then, on any
# machine: `perfmodel fit OUT_DIR/compute -o profile.json` and
# `perfmodel validate --measured OUT_DIR/validate/measured.csv --profile profile.json`.
set -u
out=${1:?usage: bash calibration/single_gpu.sh OUT_DIR [BUDGET_S]}
budget=${2:-290}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/log.txt") 2>&1

python3 - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
EOF
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv || true

start=$(date +%s)
python3 -m calibration.compute --out "$out/compute" --no-progress --budget "$budget"
echo "compute calibration: exit $? after $(( $(date +%s) - start )) s"

start=$(date +%s)
timeout 240 python3 -m perfmodel.cli validate --work-dir "$out/validate" --steps 10 --warmup 3
echo "validation runs: exit $? after $(( $(date +%s) - start )) s"
