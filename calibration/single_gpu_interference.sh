#!/usr/bin/env bash
# Interference calibration of one GPU: kernel classes side by side, as processes and as streams.
#
#   bash calibration/single_gpu_interference.sh OUT_DIR [GPU] [CYCLES]
#
# GPU: its catalogue name (default H200); CYCLES: cycles per mix (default 4). About 4 minutes on
# one H200 (9 mixes each way; phases of 0.4 s between processes, 0.3 s on streams; each CSV is
# rewritten after every mix, so a stage stopped by its time limit keeps the mixes it finished). Writes OUT_DIR/kernels-processes.csv (separate
# processes, time-sliced by the driver: the "time-slice" table), OUT_DIR/kernels-streams.csv (one
# CUDA stream per class in one process, kernels concurrent as under MPS: the "mps" table),
# OUT_DIR/tables/*.json (their fits, with CV error) and OUT_DIR/log.txt. No MPS daemon is started and
# no device setting is changed. Then, on any machine, bundle the tables where predict_shared reads them:
#   python -m perfmodel.fit.gpu_interference OUT_DIR --gpu H200 --write
set -u
out=${1:?usage: bash calibration/single_gpu_interference.sh OUT_DIR [GPU] [CYCLES]}
gpu=${2:-H200}
cycles=${3:-4}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/log.txt") 2>&1

python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,compute_mode --format=csv || true

start=$(date +%s)
timeout 170 python3 -m calibration.interference kernels --device cuda --phase 0.4 --guard 0.1 --cycles "$cycles" \
    --out "$out/kernels-processes.csv"
echo "processes: exit $? after $(( $(date +%s) - start )) s"

start=$(date +%s)
timeout 120 python3 -m calibration.interference kernels --streams --phase 0.3 --guard 0.05 --cycles "$cycles" \
    --out "$out/kernels-streams.csv"
echo "streams: exit $? after $(( $(date +%s) - start )) s"

start=$(date +%s)
timeout 60 python3 -m perfmodel.fit.gpu_interference "$out"/kernels-*.csv --gpu "$gpu" --out "$out/tables"
echo "fit: exit $? after $(( $(date +%s) - start )) s"
