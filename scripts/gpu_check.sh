#!/usr/bin/env bash
# The GPU checks of a lent NVIDIA GPU session in one device call (issue 28): install, the GPU
# tests three times (one full run, then the non-slow tests twice: each run one after the other,
# 4 xdist workers; 9 workers at once ran the host out of memory on the HBM-sized references),
# then `topi-bn bench --target cuda` on the memory-bound shapes and two conv layers.
# Every step has its own time limit so that the call ends inside the device tool's limit and
# what ran comes back under $OUT (main.log, gpu-tests-N.log, bench.log, bench/results.*).
#
# From the project root, on the development machine:
#   bash ../shared/tools/gpu/stage.sh          # writes .gpu/p1 and .gpu/p2
#   cp scripts/gpu_check.sh .gpu/p2/
#   move tuning_logs/x86-*/database_*.json out of the tree for the two calls (36 MB: with them
#   the tree and .gpu/p2 exceed the 64 MiB a call carries; put them back afterwards)
#   device run, carry [".gpu/p1"]:  bash .gpu/p1/put.sh
#   device run, carry [".gpu/p2"]:  bash .gpu/p2/gpu_check.sh      (at once: warm ~30 s)
# Timings seen on an H200 (2026-11-26): install 11 s, full run > 170 s (the slow sweeps take
# ~80 s each), non-slow run ~30 s, bench 85 s.
set -u
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # the installed package, not the source tree
OUT=${OUT:-/tmp/gpu-check-out}; mkdir -p "$OUT"
T0=$(date +%s); el(){ echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/main.log"; }
el start
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 \
  | tee -a "$OUT/main.log"
timeout 150 bash .gpu/p2/setup.sh >> "$OUT/main.log" 2>&1; rc=$?; el "setup rc=$rc"
[ $rc = 0 ] || exit $rc
export PYTHONPATH=/tmp/site
XD="-n 4"; python3 -c "import xdist" 2>/dev/null || XD=""
for i in 1 2 3; do
  if [ $i = 1 ]; then M="gpu"; TS=${FULL_S:-170}; else M="gpu and not slow"; TS=60; fi
  timeout "$TS" python3 -m pytest -q -p no:cacheprovider -m "$M" tests $XD -o addopts="" -rfE \
    --durations=8 > "$OUT/gpu-tests-$i.log" 2>&1
  echo "run $i ($M) rc=$?" >> "$OUT/gpu-tests-$i.log"
  el "tests run $i"; tail -3 "$OUT/gpu-tests-$i.log" | tee -a "$OUT/main.log"
done
timeout "${BENCH_S:-140}" python3 -m topi_bn.bench --target cuda --out "$OUT/bench" --no-check \
  --rounds 5 --dtype float32 --dtype float16 \
  --workload gpu.bn_train_nchw_256x64x112x112 --workload gpu.bn_train_nhwc_256x112x112x64 \
  --workload gpu.layer_norm_65536x4096 --workload gpu.layer_norm_16384x8192 \
  --workload layer_norm.4096x1024 --workload bn_train.nchw_32x64x56x56 \
  --workload resnet50.conv3x3_64_64_56_s1_relu --workload resnet50.conv1x1_256_64_56_s1_relu \
  > "$OUT/bench.log" 2>&1
el "bench rc=$?"; rm -f "$OUT"/bench/*.png
tail -45 "$OUT/bench.log"
