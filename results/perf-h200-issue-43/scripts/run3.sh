#!/bin/bash
export PYTHONUNBUFFERED=1 SHAPEBENCH_CACHE=/tmp/sbcache
ROOT=$PWD
T0=$(date +%s)
el() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
el after; nvidia-smi -L
PYTHONPATH=$ROOT:$ROOT/.gpu/site timeout 125 python3 -m benchmark.perf scale --budget 113M --families transformer,hc,mhc,looped,hyperloop --steps 12 --stream-dtypes auto,fp32 2>&1 | grep -v "Warning\|warn\|^$\|This call\|File \|return kernels\|Online softmax\|split the reduction\|important use case\|softmax.$\|^\[dim" | tee $OUT/scale_after_torch.log
el before
LEFT=$(( 195 - ($(date +%s) - T0) ))
(cd .gpu/before && PYTHONPATH=$ROOT/.gpu/before timeout $(( LEFT > 20 ? LEFT : 20 )) python3 -m benchmark.perf scale --budget 113M --families transformer,hc,mhc,looped,hyperloop --steps 12) 2>&1 | grep -v "Warning\|warn\|^$\|Online softmax\|split the reduction\|important use case\|softmax.$" | tee $OUT/scale_before.log
el end
