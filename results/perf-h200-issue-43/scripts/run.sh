#!/bin/bash
# GPU checks for issue 43: kernels on CUDA, perf scale after (this tree) and before (5b571f3), bf16-stream quality.
export PYTHONUNBUFFERED=1 SHAPEBENCH_CACHE=/tmp/sbcache
ROOT=$PWD
T0=$(date +%s)
el() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
el env; nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nproc; lscpu | grep "Model name"
el kernels
PYTHONPATH=$ROOT timeout 120 python3 -m pytest -q -p no:cacheprovider -x tests/test_hc_kernels.py -k "not under_the_interpreter" -rs 2>&1 | tail -25 | tee $OUT/kernels.log
el after
PYTHONPATH=$ROOT timeout 240 python3 -m benchmark.perf scale --budget 113M --families transformer,hc,mhc,looped,hyperloop --steps 20 --stream-dtypes auto,fp32 2>&1 | tee $OUT/scale_after.log | grep -v "^\[dim\]"
el before
(cd .gpu/before && PYTHONPATH=$ROOT/.gpu/before timeout 150 python3 -m benchmark.perf scale --budget 113M --families transformer,hc,mhc,looped,hyperloop --steps 20) 2>&1 | tee $OUT/scale_before.log
el quality
LEFT=$(( 500 - ($(date +%s) - T0) ))
PYTHONPATH=$ROOT:$ROOT/.gpu/site timeout $(( LEFT > 30 ? LEFT : 30 )) python3 .gpu/quality.py $(( LEFT > 60 ? LEFT - 40 : 20 )) 2>&1 | grep -v Warning | tee $OUT/quality.log
el end
