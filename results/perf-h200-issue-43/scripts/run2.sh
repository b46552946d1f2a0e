#!/bin/bash
export PYTHONUNBUFFERED=1 SHAPEBENCH_CACHE=/tmp/sbcache PYTHONPATH=$PWD
T0=$(date +%s)
el() { echo "=== $1 at $(( $(date +%s) - T0 )) s"; }
el kernels
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_hc_kernels.py -k "not under_the_interpreter" -rs 2>&1 | tail -30 > $OUT/kernels.log; tail -3 $OUT/kernels.log
el prof
timeout 220 python3 .gpu/prof.py transformer,mhc,hc,hyperloop 2>&1 | grep -v "Warning\|warn\|^$\|This call\|File \|return kernels\|Online softmax\|split the reduction\|important use case\|softmax.$" | tee $OUT/prof.log
el end
