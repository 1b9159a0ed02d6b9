# nvidia-h100-x2 (or nvidia-h200-x2): the rollout-modes benchmark (benchmarks/gpu/rollout_modes.py),
# part 1: sync, one-step-off. Both GPUs: trainer on one, the SGLang engine on the other.
# Also the install call: on a fresh machine, after the calls carrying .gpu/p1 ... .gpu/p3 (README.md,
# "carry sequence"), this call carries [".gpu/sh", ".gpu/p4"] and source setup.sh installs the kit;
# on a machine with the kit installed, carry [".gpu/sh"] only.
#   bash benchmarks/gpu/device/call_modes_1.sh          (or .gpu/sh/call_modes_1.sh after build_kit.sh)
# Each mode runs in a process of its own (its own local Ray, its own step limit; a mode cut short keeps
# the steps it finished in its JSON), writing $J/modes-<mode>.json; then the table of every mode in $J.
# MODES / MODE_ARGS override the modes and add options (e.g. MODE_ARGS="--steps 6").
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-540}
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j FAIL_TAIL=25
step kit 60 python3 benchmarks/gpu/device/kit_check.py
nvidia-smi --query-gpu=index,name,memory.total,utilization.gpu,memory.used --format=csv,noheader
R="python3 benchmarks/gpu/rollout_modes.py --steps 8 --batch 32 --n 4 --max-response-len 512 --workdir /tmp/rljob-modes $MODE_ARGS"
for mode in ${MODES:-sync one-step-off}; do
  # a mode's start (Ray, trainer, SGLang) took 126-218 s on 2 x H100 (docs/BENCHMARKS.md, session 13)
  step modes-$mode ${MODE_LIMIT:-260} $R --modes $mode --out $J/modes-$mode.json
  # NCCL into SGLang is not yet verified on these machines: when the first mode made no step (failed
  # or hung), the rest (and the first again) sync through /dev/shm instead, said in the results.
  if [ "$mode" = "${FIRST:-sync}" ] && ! grep -q '^{"mode"' $J/logs/modes-$mode.log 2>/dev/null; then
    grep -m3 -i "nccl\|error" $J/logs/modes-$mode.log | cut -c1-300
    R="$R --transport disk"; echo "==== falling back to --transport disk" | tee $J/transport-fallback.txt
    step modes-$mode-disk ${MODE_LIMIT:-260} $R --modes $mode --out $J/modes-$mode.json
  fi
done
pack
echo "==== steps"; grep -h '^{"mode"' $J/logs/modes-*.log 2>/dev/null | cut -c1-200
echo "==== report (every mode in $J)"  # pure Python, no GPU: outside the steps' budget
timeout 30 python3 benchmarks/gpu/rollout_modes.py --out $J/modes-all.json \
  --merge $J/modes-sync.json $J/modes-one-step-off.json $J/modes-buffer2.json $J/modes-partial.json $J/modes-partial-async.json
pack
