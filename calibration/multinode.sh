#!/usr/bin/env bash
# Calibrate a multi-node cluster with plain torchrun: run the SAME command on every node.
#
#   bash calibration/multinode.sh OUT_DIR NNODES GPUS_PER_NODE RDZV_HOST:PORT [calibration.collectives options]
#
#   e.g. on each of 4 nodes:  bash calibration/multinode.sh calib/cluster 4 8 node001:29500
#
# Writes OUT_DIR/collectives/{collectives.csv,metadata.json} (every collective on the whole world, inside
# each node, across nodes with one rank per node and on sub-groups; the inter-node scope needs NNODES >= 2)
# and, on the node whose NODE_RANK (or SLURM_NODEID) is 0 only, OUT_DIR/compute/ (kernels of one GPU:
# the nodes are alike, so one is measured). OUT_DIR must be on a filesystem every node sees.
# STEPS=collectives or STEPS=compute runs one part only (default: both). Then, on any machine:
#   perfmodel fit OUT_DIR/compute OUT_DIR/collectives -o cluster.json
#   perfmodel predict --gpu NODE --nodes NNODES --profile cluster.json ...
set -euo pipefail
out=${1:?usage: bash calibration/multinode.sh OUT_DIR NNODES GPUS_PER_NODE RDZV_HOST:PORT [options]}
nnodes=${2:?NNODES missing}
nproc=${3:?GPUS_PER_NODE missing}
endpoint=${4:?RDZV_HOST:PORT missing}
shift 4
steps=${STEPS:-both}
node_rank=${NODE_RANK:-${SLURM_NODEID:-0}}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"

if [ "$steps" != compute ]; then
    # c10d rendezvous: the nodes find each other at RDZV_HOST:PORT, whatever order they start in
    "$python" -m torch.distributed.run --nnodes "$nnodes" --nproc-per-node "$nproc" \
        --rdzv-backend c10d --rdzv-endpoint "$endpoint" --rdzv-id "perfmodel-calibration" \
        -m calibration.collectives --out "$out/collectives" --no-progress "$@"
fi
if [ "$steps" != collectives ] && [ "$node_rank" = 0 ]; then
    "$python" -m calibration.compute --out "$out/compute" --no-progress
fi
echo "node $node_rank: calibration into $out done"
