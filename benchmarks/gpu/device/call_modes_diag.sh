# nvidia-h100-x2: one rollout mode with every thread's stack dumped each 60 s, the processes and GPUs
# every 15 s, and the engines' and Ray's logs packed: to see where a run that makes no step waits.
#   MODES=sync LIMIT=420 bash benchmarks/gpu/device/call_modes_diag.sh   (carry [".gpu/sh"], or p4 on a fresh machine)
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-560}
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j FAIL_TAIL=60 RLJOB_STACKS_EVERY_S=60
( while true; do
    { date +%T; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
      nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
      ps -eo pid,ppid,etime,pcpu,args --sort=start_time | grep -E "sglang|ray::|rollout_modes|raylet|router" | grep -v grep | cut -c1-220
    } >> $J/monitor.log 2>&1; sleep 15; done ) &
MON=$!
for mode in ${MODES:-sync}; do
  step modes-$mode ${LIMIT:-420} python3 benchmarks/gpu/rollout_modes.py --steps ${STEPS:-4} --batch 32 --n 4 \
    --max-response-len 512 --workdir /tmp/rljob-modes $MODE_ARGS --modes $mode --out $J/modes-$mode.json
done
kill $MON
mkdir -p $J/engines; for d in /tmp/rljob-engines-*; do cp -r $d $J/engines/ 2>/dev/null; done
mkdir -p $J/ray; cp /tmp/ray/session_latest/logs/*.err $J/ray/ 2>/dev/null
find $J/ray -size +2M -delete
pack
tail -40 $J/monitor.log | cut -c1-200
echo "==== engine logs"; for f in $J/engines/*/*.log; do echo "-- $f"; tail -15 $f | cut -c1-250; done
for mode in ${MODES:-sync}; do echo "==== run log $mode"; tail -${RUN_TAIL:-70} $J/logs/modes-$mode.log | cut -c1-220; done
