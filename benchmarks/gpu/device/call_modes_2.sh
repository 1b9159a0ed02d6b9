# nvidia-h100-x2 (or nvidia-h200-x2), after call_modes_1.sh on the same warm machine (carry
# [".gpu/sh"]): the rollout-modes benchmark, part 2: buffer2 and partial (dynamic sampling with a
# keep-every-group filter, 1.5x over-sampling, partial rollout); a third call on the same machine
# takes the last mode: MODES=partial-async bash benchmarks/gpu/device/call_modes_2.sh. Then the table
# of every mode in $J (the earlier calls' JSONs are still there on the same machine).
#   bash benchmarks/gpu/device/call_modes_2.sh          (or .gpu/sh/call_modes_2.sh after build_kit.sh)
# MODES / MODE_ARGS as in call_modes_1.sh.
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-540}
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j FAIL_TAIL=25
nvidia-smi --query-gpu=index,name,memory.total,utilization.gpu,memory.used --format=csv,noheader
[ -f $J/transport-fallback.txt ] && MODE_ARGS="$MODE_ARGS --transport disk"  # as call 1 decided
R="python3 benchmarks/gpu/rollout_modes.py --steps 8 --batch 32 --n 4 --max-response-len 512 --workdir /tmp/rljob-modes $MODE_ARGS"
for mode in ${MODES:-buffer2 partial}; do
  step modes-$mode ${MODE_LIMIT:-260} $R --modes $mode --out $J/modes-$mode.json
done
pack
echo "==== steps"; grep -h '^{"mode"' $J/logs/modes-partial*.log 2>/dev/null | cut -c1-200
echo "==== report (every mode in $J)"  # pure Python, no GPU: outside the steps' budget
timeout 30 python3 benchmarks/gpu/rollout_modes.py --out $J/modes-all.json \
  --merge $J/modes-sync.json $J/modes-one-step-off.json $J/modes-buffer2.json $J/modes-partial.json $J/modes-partial-async.json
pack
