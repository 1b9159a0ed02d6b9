# Sourced by run.sh after setup.sh: where a run's results go, and the `step` that runs one command of a
# suite with its own time limit.
#   RESULTS       $OUT when set, else .gpu/results/<suite>-<date>-<time> under the repo root: one
#                 logs/<step>.log per step, the JSON results and server logs beside them, `failed`
#                 listing the steps that did not exit 0
#   BUDGET        seconds for the whole run (default: none); a step that would outlast it gets what is
#                 left, and is skipped when that is under 30 s
#   LIMIT_SCALE   an integer that multiplies every step's limit (default 1: the limits below are a
#                 guard against a hang, with room over the times in docs/BENCHMARKS.md)
#   ONLY, SKIP    space-separated shell patterns of step names: run only those / all but those
#   FAIL_TAIL     lines of a failed step's log printed (default 25)
# A run whose kit is not installed yet (setup.sh's KIT_STATE: parts still missing) stops here, rc 3.
if [ -n "${KIT_STATE:-}" ] && [ "$KIT_STATE" != installed ]; then
  echo "KIT NOT INSTALLED (KIT_STATE=$KIT_STATE): copy the kit's missing parts into .gpu/ first (benchmarks/gpu/host/README.md)"
  exit 3
fi
RUN_START=${RUN_START:-$(date +%s)}
RESULTS=${OUT:-$PWD/.gpu/results/${SUITE:-run}-$(date +%Y%m%d-%H%M%S)}
J=$RESULTS  # the JSON results, RLJOB_RESULTS_DIR and the servers' logs
LOGS=$RESULTS/logs
mkdir -p "$LOGS"
MODEL_ROOT=${MODEL_ROOT:-/dev/shm/rljob-models}  # model directories the benchmarks make once and reuse

_selected() {  # NAME: whether ONLY / SKIP let this step run
  local p
  if [ -n "${ONLY:-}" ]; then
    local hit=1
    for p in $ONLY; do [[ $1 == $p ]] && hit=0; done
    [ $hit = 0 ] || return 1
  fi
  for p in ${SKIP:-}; do [[ $1 == $p ]] && return 1; done
  return 0
}

step() {  # NAME LIMIT CMD...: run CMD with LIMIT s (x LIMIT_SCALE) into $LOGS/NAME.log
  local name=$1 limit=$2; shift 2
  _selected "$name" || return 0
  local log=$LOGS/$name.log left
  limit=$(( limit * ${LIMIT_SCALE:-1} ))
  if [ -n "${BUDGET:-}" ]; then
    left=$(( BUDGET - ($(date +%s) - RUN_START) - 10 ))
    if (( limit > left )); then limit=$left; fi
    if (( limit < 30 )); then echo "== $name SKIPPED: ${left} s left of BUDGET=$BUDGET" | tee -a "$log"; return 0; fi
  fi
  echo "== $name (limit ${limit} s): $*" >> "$log"
  local t0 rc per_test addopts=${PYTEST_ADDOPTS:-}
  # pytest's own per-test limit ends inside the step's, so a hung test fails with its traceback
  # before the step is killed (run.sh sets PYTEST_TIMEOUT_OK when pytest-timeout is installed)
  per_test=$(( limit - 60 ))
  if [ -n "${TEST_TIMEOUT:-}" ] && (( TEST_TIMEOUT < per_test )); then per_test=$TEST_TIMEOUT; fi
  if [ -n "${PYTEST_TIMEOUT_OK:-}" ] && (( per_test >= 30 )); then addopts="--timeout=$per_test $addopts"; fi
  t0=$(date +%s)
  PYTEST_ADDOPTS=$addopts timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  echo "== $name rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$log"
  if (( rc != 0 )); then
    echo "$name rc=$rc" >> "$RESULTS/failed"
    grep -v "Loading weights\|WARNING\|it/s\]" "$log" | tail -"${FAIL_TAIL:-25}" | cut -c1-400 | sed "s/^/   $name| /"
  fi
  return 0
}

gpu_count() {  # the GPUs this process sees (CUDA_VISIBLE_DEVICES when set)
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .
  else
    nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .
  fi
}

gpu_memory_gib() {  # the first visible GPU's memory, GiB (0 when unknown)
  local m
  m=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  echo $(( ${m:-0} / 1024 ))
}

host_info() {
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  echo "host: $(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  free -g | head -2
}

# the weight sync benchmark into SGLang (benchmarks/gpu/sglang_weight_sync.py), one process per model (a
# stuck model cannot take the others' time); SYNC_ARGS: more options, SYNC_TAG: a JSON file suffix
sync_models() {  # transport (ipc|nccl), then models
  local t=$1 m; shift
  for m in "$@"; do
    step sync-$t-$m${SYNC_TAG:+-$SYNC_TAG} "${SYNC_LIMIT:-300}" python3 benchmarks/gpu/sglang_weight_sync.py \
      --transport "$t" --models "$m" --reps 5 ${SYNC_ARGS:-} \
      --json "$J/sync-$t-$m${SYNC_TAG:+-$SYNC_TAG}.json" --model-root "$MODEL_ROOT" --log-dir "$J/serverlogs"
  done
}

# the lines worth reading from every log of this run (pytest outcomes, the tests' printed results,
# benchmark tables and target lines)
summary() {
  echo "==== summary ($LOGS)"
  grep -h -E "^(=+ .*(passed|failed|error|skipped).* =+$|VERDICT |FAILED|ERROR |[a-z-]+sglang learned|syncs:|kill:|nccl syncs:|broadcast kill:|resumed:|engine GPU memory|start failures|\| |target|weight sync into|colocated GRPO|trainer resident|does not fit|estimated GPU memory|== .* rc=)" \
    "$LOGS"/*.log 2>/dev/null | cut -c1-260 | tail -"${SUMMARY_LINES:-150}"
}
