# Sourced by the call scripts after setup.sh. `step NAME LIMIT CMD...` runs one step with its own time
# limit, cut to what is left of the call's budget (CALL_BUDGET s, default 560: the device's limit is
# 600 and what is under $OUT must still be written), appends its output to $OUT/NAME.log and re-packs
# the JSON results and the engine servers' logs into $OUT/results.tgz after every step (8 files at most
# come back from a call).
# A call whose kit is not installed yet (setup.sh's KIT_STATE: parts still to carry) stops here, rc 3.
if [ -n "${KIT_STATE:-}" ] && [ "$KIT_STATE" != installed ]; then
  echo "KIT NOT INSTALLED (KIT_STATE=$KIT_STATE): carry the remaining .gpu/pK first (README.md)"; exit 3
fi
J=/tmp/rljob-json; mkdir -p $J
CALL_START=${CALL_START:-$(date +%s)}
CALL_BUDGET=${CALL_BUDGET:-560}
# STEP_LOGS=j: logs go to $J/logs (inside results.tgz) instead of one $OUT file each, for calls with
# more steps than the 8 files a call brings back; a failed step's last lines are printed either way.
pack() { (flock 9; tar czf $OUT/results.tgz -C $J . 2>/dev/null) 9>/tmp/rljob-pack.lock; }
step() {
  local name=$1 limit=$2; shift 2
  local log=$OUT/$name.log
  [ "${STEP_LOGS:-out}" = j ] && { mkdir -p $J/logs; log=$J/logs/$name.log; }
  local left=$(( CALL_BUDGET - ($(date +%s) - CALL_START) - 10 ))
  (( limit > left )) && limit=$left
  if (( limit < 30 )); then echo "== $name SKIPPED: ${left} s left in the call" | tee -a $log; return 0; fi
  echo "== $name (limit ${limit} s): $*" >> $log
  local t0=$(date +%s)
  timeout --kill-after=10 $limit "$@" >> $log 2>&1
  local rc=$?
  echo "== $name rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a $log
  (( rc != 0 )) && grep -v "Loading weights\|WARNING\|it/s\]" $log | tail -${FAIL_TAIL:-12} | cut -c1-400 | sed "s/^/   $name| /"
  pack
  return 0
}
# the weight sync benchmark into SGLang (benchmarks/gpu/sglang_weight_sync.py), one process per model (a
# stuck model cannot take the others' time); SYNC_ARGS: more options, SYNC_TAG: a JSON file suffix
sync_models() {  # transport (ipc|nccl), then models
  local t=$1; shift
  for m in "$@"; do
    step sync-$t-$m ${SYNC_LIMIT:-200} python3 benchmarks/gpu/sglang_weight_sync.py --transport $t --models $m --reps 5 $SYNC_ARGS \
      --json $J/sync-$t-$m${SYNC_TAG:+-$SYNC_TAG}.json --model-root /dev/shm/rljob-models --log-dir $J/serverlogs
  done
}
# the lines worth reading from every log of this call (pytest outcomes, the tests' printed results,
# benchmark tables and target lines), for the reply's output tail
summary() {
  echo "==== summary"
  grep -h -E "^(=+ .*(passed|failed|error|skipped).* =+$|FAILED|ERROR |[a-z-]+sglang learned|syncs:|kill:|nccl syncs:|broadcast kill:|resumed:|engine GPU memory|start failures|\| |target|weight sync into|colocated GRPO|trainer resident|== .* rc=)" \
    $J/logs/*.log 2>/dev/null | cut -c1-260 | tail -${SUMMARY_LINES:-120}
}
