# Sourced by the call scripts after setup.sh. `step NAME LIMIT CMD...` runs one step with its own time
# limit, cut to what is left of the call's budget (CALL_BUDGET s, default 560: the device's limit is
# 600 and what is under $OUT must still be written), appends its output to $OUT/NAME.log and re-packs
# the JSON results and the engine servers' logs into $OUT/results.tgz after every step (8 files at most
# come back from a call).
J=/tmp/rljob-json; mkdir -p $J
CALL_START=${CALL_START:-$(date +%s)}
CALL_BUDGET=${CALL_BUDGET:-560}
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( CALL_BUDGET - ($(date +%s) - CALL_START) - 10 ))
  (( limit > left )) && limit=$left
  if (( limit < 30 )); then echo "== $name SKIPPED: ${left} s left in the call" | tee -a $OUT/$name.log; return 0; fi
  echo "== $name (limit ${limit} s): $*" >> $OUT/$name.log
  local t0=$(date +%s)
  timeout --kill-after=10 $limit "$@" >> $OUT/$name.log 2>&1
  local rc=$?
  echo "== $name rc=$rc in $(( $(date +%s) - t0 )) s: $*" | tee -a $OUT/$name.log
  tar czf $OUT/results.tgz -C $J . 2>/dev/null
  return 0
}
# the weight sync benchmark, one process per model (a stuck model cannot take the others' time);
# SYNC_ARGS: more options (e.g. --bucket-mb 2048), SYNC_TAG: a suffix for the JSON file
sync_models() {  # transport, then models
  local t=$1; shift
  for m in "$@"; do
    step sync ${SYNC_LIMIT:-200} python3 benchmarks/gpu/weight_sync_path.py --transport $t --models $m --reps 5 $SYNC_ARGS \
      --json $J/sync-$t-$m${SYNC_TAG:+-$SYNC_TAG}.json --model-root /dev/shm/rljob-models --log-dir $J/serverlogs
  done
  grep -E "sync [0-9]+ |GB/s|target|FAILED|rc=" $OUT/sync.log | tail -40
}
