# nvidia-h200-x2, carry .gpu/c1 .gpu/sh (first call: installs c1). The full-path weight sync
# benchmark, NCCL (producer cuda:0, engine cuda:1) then IPC (both on cuda:0), models kept in /dev/shm.
source .gpu/sh/setup.sh || exit 1
M="--model-root /dev/shm/rljob-models --log-dir /tmp/synclogs"
for t in nccl ipc; do
  timeout 280 python3 benchmarks/gpu/weight_sync_path.py --transport $t --models 0.5b,1.5b,4b --reps 5 --json $OUT/$t.json $M > $OUT/$t.log 2>&1
  echo "$t rc=$?" >> $OUT/$t.log; tail -14 $OUT/$t.log
done
