#!/usr/bin/env bash
# The GPU checks of a lent NVIDIA GPU session in one device call (issue 28): install, the GPU
# tests (RUNS, by default one full run and the non-slow tests twice: each run one after the
# other, 4 xdist workers; 9 workers at once ran the host out of memory on the HBM-sized
# references), then `topi-bn bench --target cuda` on the memory-bound shapes and two conv layers
# (BENCH_DTYPES, BENCH_WORKLOADS, BENCH_S to change them), and with PROFILE (workload:dtype
# ...) each kernel's time and DRAM traffic under Nsight Compute (scripts/gpu_kernel_times.py);
# last, compute-sanitizer memcheck and racecheck on small norm workloads (SANITIZE, SANITIZE_S).
# With TUNE (e.g. "gpu:float16:8") `topi-bn tune --target cuda` runs before the bench, which
# then builds with that log (back as cuda-log.tgz); with CONV_BATCH (e.g. 32) ResNet-50 conv
# layers at that batch run against cuDNN (scripts/gpu_conv_batch.py).
# Every step has its own time limit so that the call ends inside the device tool's limit and
# what ran comes back under $OUT (main.log, gpu-tests-N.log, bench.log, bench/results.*).
#
# From the project root, on the development machine:
#   bash ../shared/tools/gpu/stage.sh          # writes .gpu/p1 and .gpu/p2
#   cp scripts/gpu_check.sh .gpu/p2/
#   move tuning_logs/x86-*/*.json out of the tree for the two calls (87 MB: with them
#   the tree and .gpu/p2 exceed the 64 MiB a call carries; put them back afterwards)
#   device run, carry [".gpu/p1"]:  bash .gpu/p1/put.sh
#   device run, carry [".gpu/p2"]:  bash .gpu/p2/gpu_check.sh      (at once: warm ~30 s)
# Timings seen on an H200 (2026-11-26): machine start + piece 1 ~30 s, install 8-12 s, full run
# 91-107 s, non-slow run ~30 s, bench 8 workloads x 3 dtypes 1.9 min (x 2 dtypes 85 s). On an
# H100 (2026-11-27, 15 minutes of device time): start + piece 1 33 s, install 15 s, full runs
# 107-125 s, the same bench 1.6 min to its results (its process then did not exit within the
# step's 110 s limit: give BENCH_S room and read bench/results.*), racecheck of 4 norm workloads
# 15 s, `topi-bn tune --target cuda` about 50 s a workload at 6-8 trials before its verification
# (tune in a call of its own, a few workloads at a time). E.g.
#   RUNS="full:220" BENCH_DTYPES="float32 float16 bfloat16" BENCH_S=190 bash .gpu/p2/gpu_check.sh
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
# RUNS: the test runs, one after the other, as "mode:seconds" (full: every GPU test; quick: the
# non-slow ones)
i=0
for run in ${RUNS:-full:200 quick:60 quick:60}; do
  i=$((i + 1)); mode=${run%%:*}; TS=${run##*:}
  if [ "$mode" = full ]; then M="gpu"; else M="gpu and not slow"; fi
  timeout "$TS" python3 -m pytest -q -p no:cacheprovider -m "$M" tests $XD -o addopts="" -rfE \
    --durations=8 > "$OUT/gpu-tests-$i.log" 2>&1
  echo "run $i ($M) rc=$?" >> "$OUT/gpu-tests-$i.log"
  el "tests run $i"; tail -3 "$OUT/gpu-tests-$i.log" | tee -a "$OUT/main.log"
done
# TUNE: `topi-bn tune --target cuda` runs, one after the other, as "workloads:dtype:trials"
# (e.g. "gpu:float16:8"), together at most TUNE_S seconds, into TUNE_DIR (records are merged
# after each workload, so a run cut short keeps what it finished; the tuner then checks its
# winners against the default schedules, timed in turns); the bench below and CONV_BATCH then
# build with that log, and it comes back as $OUT/cuda-log.tgz
LOGS=shipped
if [ -n "${TUNE:-}" ]; then
  TUNE_DIR=${TUNE_DIR:-/tmp/cuda-log}; mkdir -p "$TUNE_DIR"; LOGS=$TUNE_DIR; TE=$(( $(date +%s) + ${TUNE_S:-240} ))
  for t in $TUNE; do
    left=$(( TE - $(date +%s) )); [ $left -gt 20 ] || break
    IFS=: read -r tw td tn <<< "$t"
    timeout $left python3 -m topi_bn.cli tune --target cuda --workloads "$tw" --dtype "$td" \
      --trials "$tn" --log-dir "$TUNE_DIR" >> "$OUT/tune.log" 2>&1
    el "tune $t rc=$?"; tail -6 "$OUT/tune.log" | tee -a "$OUT/main.log"
  done
  tar -czf "$OUT/cuda-log.tgz" -C "$TUNE_DIR" .
fi
timeout "${BENCH_S:-140}" python3 -m topi_bn.bench --target cuda --out "$OUT/bench" --no-check \
  --tuning-logs "$LOGS" --rounds 5 $(for d in ${BENCH_DTYPES:-float32 float16}; do echo --dtype $d; done) \
  $(for w in ${BENCH_WORKLOADS:-gpu.bn_train_nchw_256x64x112x112 gpu.bn_train_nhwc_256x112x112x64 \
    gpu.layer_norm_65536x4096 gpu.layer_norm_16384x8192 layer_norm.4096x1024 \
    bn_train.nchw_32x64x56x56 resnet50.conv3x3_64_64_56_s1_relu \
    resnet50.conv1x1_256_64_56_s1_relu}; do echo --workload $w; done) \
  > "$OUT/bench.log" 2>&1
el "bench rc=$?"; rm -f "$OUT"/bench/*.png
tail -45 "$OUT/bench.log"
# CONV_BATCH: ResNet-50 conv layers at this batch, float16, against cuDNN (scripts/gpu_conv_batch.py)
if [ -n "${CONV_BATCH:-}" ]; then
  timeout "${CONV_S:-90}" python3 scripts/gpu_conv_batch.py --batch "$CONV_BATCH" \
    --tuning-logs "$LOGS" > "$OUT/conv-batch.log" 2>&1
  el "conv batch $CONV_BATCH rc=$?"; tail -12 "$OUT/conv-batch.log" | tee -a "$OUT/main.log"
fi
if [ -n "${PROFILE:-}" ]; then  # e.g. PROFILE="gpu.bn_train_nhwc_256x112x112x64:float16"
  timeout "${PROFILE_S:-90}" python3 scripts/gpu_kernel_times.py $PROFILE > "$OUT/kernel-times.txt" 2>&1
  el "kernel times rc=$?"; cat "$OUT/kernel-times.txt"
fi
# compute-sanitizer on small norm workloads: memcheck (out-of-bounds and misaligned accesses,
# e.g. a sum reading past a shared buffer) and racecheck (shared-memory hazards between threads),
# which the CPU-side checks only model; SANITIZE="" skips it
for tool in memcheck racecheck; do
  [ -n "${SANITIZE-x}" ] || break
  timeout "${SANITIZE_S:-120}" compute-sanitizer --tool $tool --error-exitcode 9 \
    python3 scripts/gpu_kernel_times.py --run ${SANITIZE:-bn_train.nhwc_8x256x28x28:float32 \
    bn_train.nhwc_32x64x56x56:float16 bn_train.nchw_32x64x56x56:float16 \
    smoke.bn_train_4x8x6x6:float32 layer_norm.512x4096:float32 layer_norm.4096x1024:float16} \
    > "$OUT/sanitizer-$tool.txt" 2>&1
  el "compute-sanitizer $tool rc=$?"; tail -4 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/main.log"
done
