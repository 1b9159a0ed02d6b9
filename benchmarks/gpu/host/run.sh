#!/usr/bin/env bash
# run.sh SUITE [ARGS...] — one suite of GPU tests and benchmarks on a GPU host, from a checkout of the
# repo with the kit's parts in .gpu/ (README.md: build the kit where there is network, copy it over).
#
#   bash benchmarks/gpu/host/run.sh tests [PYTEST ARGS]   pytest -m gpu tests/gpu (ARGS: e.g. -k sglang)
#   bash benchmarks/gpu/host/run.sh sglang     SGLang engines in the runtime: engine, IPC codecs, offload,
#                                              colocated syncs and a killed engine, GRPO learns (torch,
#                                              megatron), resume, a colocated 1.5B step, the examples
#                                              scaled down, NCCL into SGLang
#   bash benchmarks/gpu/host/run.sh rollout    the runtime's rollout path against stock SGLang (tokens/s),
#                                              0.5B and 1.5B, 2048 requests, 3 runs each
#   bash benchmarks/gpu/host/run.sh sync       weight sync into SGLang (IPC on one GPU, NCCL across two)
#                                              and the driver's GPU sync test (IPC; NCCL with two GPUs)
#   bash benchmarks/gpu/host/run.sh megatron   the Megatron GPU tests, a widened 2B SmolLM2 learning, MFU
#                                              (1b, 4b, 8b at TP 2), the dynamic-batching benchmark, the
#                                              colocated 4B GRPO step
#   bash benchmarks/gpu/host/run.sh modes      rollout modes against sync (two GPUs: trainer, engine)
#   bash benchmarks/gpu/host/run.sh kit        only the kit check
#
# Every suite sources setup.sh (installs the kit on first use), checks the kit, prints the host, then
# runs its steps, each with a time limit (lib.sh: RESULTS, BUDGET, LIMIT_SCALE, ONLY, SKIP). It prints
# where the logs go ($OUT when set, else .gpu/results/<suite>-<date>-<time>), a summary at the end,
# and exits 1 when a step failed. Steps that need two GPUs are skipped on one. Options by suite:
#   rollout       ROLLOUT_MODELS ("0.5b 1.5b"), ROLLOUT_ARGS (added to every run, e.g. "--runs 5")
#   sglang, sync  MODEL_ROOT (/dev/shm/rljob-models), SYNC_MODELS ("4b 0.5b 1.5b"),
#                 SYNC_BUCKETS_MB (more 4b runs at these bucket sizes, e.g. "1024 2048"), SYNC_ARGS
#   megatron      MFU_RUNS (3), MFU_ARGS (added to every MFU run), RECOMPUTE_LAYERS (the chunked-head 4b:
#                 recompute only the first K layers; default all), C4B_CKPT (the colocated 4B's checkpoint
#                 directory, /tmp/rljob-colocated-4b-ckpt: about 64 GB free needed there)
#   modes         MODES ("sync one-step-off buffer2 partial partial-async"), MODE_STEPS (8), MODE_LIMIT
#                 (900 s per mode), MODE_ARGS (e.g. "--transport disk"), DIAG=1 (every thread's stack each
#                 60 s, processes and GPUs each 15 s, the engines' and Ray's logs kept)
#   tests         TEST_TIMEOUT (per test, when pytest-timeout is installed: 900 s, and always 60 s less
#                 than its step's limit, so a hung test fails with its traceback), TESTS_LIMIT (7200 s)
set -uo pipefail
SUITE=${1:-}
[ $# -gt 0 ] && shift
case "$SUITE" in
  tests | sglang | rollout | sync | megatron | modes | kit) ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
if [ "$SUITE" != tests ] && [ $# -gt 0 ]; then echo "run.sh $SUITE takes no arguments (options are variables)"; exit 2; fi
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 2
export SUITE
source benchmarks/gpu/host/setup.sh || exit 1
source benchmarks/gpu/host/lib.sh
export RLJOB_RESULTS_DIR=$J
echo "suite $SUITE: logs and results in $RESULTS"
host_info
step kit 120 python3 benchmarks/gpu/host/kit_check.py
NGPU=$(gpu_count)
echo "GPUs visible: $NGPU"
G=tests/gpu
# each pytest step gets --timeout: its limit less 60 s, at most TEST_TIMEOUT (lib.sh's step)
python3 -c "import pytest_timeout" 2>/dev/null && export PYTEST_TIMEOUT_OK=1 TEST_TIMEOUT=${TEST_TIMEOUT:-900}
PYTEST=(python3 -m pytest -q -s -p no:cacheprovider)
two_gpus() {  # NAME: whether a step that needs two GPUs can run here
  (( NGPU >= 2 )) && return 0
  _selected "$1" && echo "== $1 SKIPPED: needs two GPUs, $NGPU visible" | tee -a "$LOGS/$1.log"
  return 1
}

suite_tests() {
  step tests "${TESTS_LIMIT:-7200}" "${PYTEST[@]}" -m gpu "$G" --basetemp=/tmp/rljob-pt "$@"
}

suite_sglang() {
  # Two streams, each test with its own local Ray, pytest --basetemp and (with two GPUs) its own GPU;
  # with one GPU they run one after the other
  stream_a() {
    local T=("${PYTEST[@]}" --basetemp=/tmp/rljob-pt-a)
    step engine 600 "${T[@]}" $G/test_sglang_engine.py $G/test_cuda_ipc_codec.py $G/test_trainer_offload_gpu.py
    step sync-kill 600 "${T[@]}" "$G/test_sglang_grpo.py::test_every_sync_matches_a_fresh_server_and_a_killed_engine_loses_nothing"
    step learn-torch 600 "${T[@]}" "$G/test_sglang_grpo.py::test_grpo_learns_colocated_with_sglang[torch]"
  }
  stream_b() {
    local T=("${PYTEST[@]}" --basetemp=/tmp/rljob-pt-b)
    step learn-megatron 600 "${T[@]}" "$G/test_sglang_grpo.py::test_grpo_learns_colocated_with_sglang[megatron]"
    step resume 600 "${T[@]}" "$G/test_sglang_grpo.py::test_a_stopped_run_resumes_from_its_checkpoint"
    step colocated-1.5b 600 python3 benchmarks/gpu/colocated_step.py --model 1.5b --backend torch --mem-fraction 0.85 \
      --steps 2 --json "$J/colocated-1.5b.json" --model-root "$MODEL_ROOT"
    step example-job 600 "${T[@]}" "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-job.yaml]"
  }
  if (( NGPU >= 2 )); then
    (export CUDA_VISIBLE_DEVICES=0; stream_a) &
    (export CUDA_VISIBLE_DEVICES=1; stream_b) &
    wait
  else
    stream_a
    stream_b
  fi
  local T=("${PYTEST[@]}" --basetemp=/tmp/rljob-pt)
  if two_gpus nccl; then step nccl 600 "${T[@]}" $G/test_sglang_nccl.py; fi
  if two_gpus examples-2gpu; then
    step examples-2gpu 900 "${T[@]}" "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-disaggregated.yaml]" \
      "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-async.yaml]"
  fi
}

suite_rollout() {
  # the runtime's rollout path against stock SGLang, per model: stock first (its own server), then the
  # runtime with the ratio to those stock rows; each step fits a 10-minute window on one H100
  # (0.5b: also the plain stock client, and the runtime at 512 requests in flight, its old fixed limit)
  local m stock_extra runtime_extra
  # shellcheck disable=SC2206  # ROLLOUT_ARGS: options, split on spaces
  local EXTRA=(${ROLLOUT_ARGS:-})
  for m in ${ROLLOUT_MODELS:-0.5b 1.5b}; do
    stock_extra=(--no-stock-plain) runtime_extra=()
    [ "$m" = 0.5b ] && stock_extra=() runtime_extra=(--also-concurrency 512)
    step "throughput-$m-stock" 900 python3 benchmarks/gpu/rollout_throughput.py --model "$m" --modes stock \
      "${stock_extra[@]}" "${EXTRA[@]}" --model-root "$MODEL_ROOT" --json "$J/throughput-$m-stock.json"
    step "throughput-$m" 900 python3 benchmarks/gpu/rollout_throughput.py --model "$m" --modes runtime \
      "${runtime_extra[@]}" "${EXTRA[@]}" --stock-from "$J/throughput-$m-stock.json" --model-root "$MODEL_ROOT" \
      --json "$J/throughput-$m.json"
  done
}

suite_sync() {
  local models=${SYNC_MODELS:-4b 0.5b 1.5b} mb
  # shellcheck disable=SC2086  # word lists
  sync_models ipc $models
  for mb in ${SYNC_BUCKETS_MB:-}; do SYNC_TAG=$mb SYNC_ARGS="${SYNC_ARGS:-} --bucket-mb $mb" sync_models ipc 4b; done
  if two_gpus sync-nccl; then
    # shellcheck disable=SC2086
    sync_models nccl $models
    for mb in ${SYNC_BUCKETS_MB:-}; do SYNC_TAG=$mb SYNC_ARGS="${SYNC_ARGS:-} --bucket-mb $mb" sync_models nccl 4b; done
  fi
  # the runtime's driver, SmolLM2 on the hf engine: every push through the expected transport, the
  # engine's checksums equal to the trainer's after the last sync
  step driver-torch-ipc 600 "${PYTEST[@]}" $G/test_gpu_sync_grpo.py -k torch-ipc
  step driver-megatron-ipc 600 "${PYTEST[@]}" $G/test_gpu_sync_grpo.py -k megatron-ipc
  if two_gpus driver-nccl; then
    step driver-torch-nccl 600 "${PYTEST[@]}" $G/test_gpu_sync_grpo.py -k torch-nccl
    step driver-megatron-nccl 600 "${PYTEST[@]}" $G/test_gpu_sync_grpo.py -k megatron-nccl
  fi
}

suite_megatron() {
  local T=("${PYTEST[@]}" --basetemp=/tmp/rljob-pt)
  step fusions 600 "${T[@]}" $G/test_megatron_fusions_gpu.py
  step lm-head 600 "${T[@]}" $G/test_megatron_lm_head_gpu.py
  # training.fusions, training.lmHead and training.megatronArgs through a colocated GRPO job (2 steps)
  step job-fields 600 "${T[@]}" $G/test_megatron_job_fields.py
  # advantageEstimator ppo: the megatron critic trains, saves beside the policy and resumes (two runs)
  step critic 600 "${T[@]}" $G/test_megatron_critic_gpu.py
  # a random Qwen3-MoE (Qwen3-30B-A3B scaled down) colocated with SGLang: experts trained and synced, EP 1
  step moe 600 "${T[@]}" $G/test_megatron_moe_gpu.py
  # training.routingReplay on that MoE: SGLang's routing records reach the trainer and keep its log-probs
  step routing-replay 600 "${T[@]}" $G/test_routing_replay_gpu.py
  # expert parallel 2 against 1 on that MoE shape (2 GPUs, the alltoall dispatcher), step times and MFU
  if two_gpus ep; then step ep 900 "${T[@]}" $G/test_megatron_ep_gpu.py; fi
  step optimizer-offload 600 "${T[@]}" $G/test_optimizer_offload_gpu.py
  step dynamic-batch-test 600 "${T[@]}" $G/test_dynamic_batch_gpu.py
  step backend 600 "${T[@]}" $G/test_megatron_backend.py
  step group 600 "${T[@]}" $G/test_megatron_group.py
  step equivalence 900 env RLJOB_SMOLLM2_DIR="$RLJOB_CACHE/models/SmolLM2-135M-Instruct" "${T[@]}" $G/test_megatron_equivalence.py
  # SmolLM2 widened to 1.97B (function kept) learns the demo's task colocated with SGLang, 20 steps
  step learn-widened-2b 600 "${T[@]}" $G/test_widened_grpo.py

  # MFU: random Qwen3-shaped models, seq 4096, the plain-torch fusions; each figure the median of MFU_RUNS
  local MFU=(python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope --runs "${MFU_RUNS:-3}")
  # shellcheck disable=SC2206  # MFU_ARGS: options, split on spaces
  local EXTRA=(${MFU_ARGS:-})
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  (
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    step mfu-1b 600 "${MFU[@]}" --models 1b --micro-batches 8 --steps 3 --warmup 2 "${EXTRA[@]}" --json "$J/mfu-1b.json"
    step mfu-1b-b2 600 "${MFU[@]}" --models 1b --micro-batches 4 --micro-batch-size 2 --steps 3 --warmup 2 "${EXTRA[@]}" \
      --json "$J/mfu-1b-b2.json"
    step mfu-1b-unfused 600 python3 benchmarks/gpu/megatron_mfu.py --models 1b --micro-batches 8 "${EXTRA[@]}" \
      --json "$J/mfu-1b-unfused.json"
    step mfu-1b-profile 600 python3 benchmarks/gpu/megatron_mfu.py --models 1b --fusions wgrad,norm,rope --micro-batches 8 \
      --profile "${EXTRA[@]}" --json "$J/mfu-1b-profile.json"
    step mfu-4b-offload 900 "${MFU[@]}" --models 4b --offload-optimizer --micro-batches 8 --steps 2 --warmup 1 "${EXTRA[@]}" \
      --json "$J/mfu-4b-offload.json"
    # the 4b with full-parameter Adam in GPU memory needs more than an 80 GB GPU
    if (( $(gpu_memory_gib) >= 100 )); then
      step mfu-4b 900 "${MFU[@]}" --models 4b --micro-batches 8 --steps 2 --warmup 1 "${EXTRA[@]}" --json "$J/mfu-4b.json"
    fi
    step mfu-4b-chunked 900 python3 benchmarks/gpu/megatron_mfu.py --models 4b --fusions wgrad,norm,rope --micro-batches 8 \
      --steps 3 --warmup 1 --lm-head chunked --recompute full ${RECOMPUTE_LAYERS:+--recompute-layers "$RECOMPUTE_LAYERS"} \
      "${EXTRA[@]}" --json "$J/mfu-4b-chunked.json"
  )
  if two_gpus mfu-8b-tp2; then
    step mfu-8b-tp2 900 torchrun --nproc-per-node 2 benchmarks/gpu/megatron_mfu.py --models 8b --tp 2 --offload-optimizer \
      --fusions wgrad,norm,rope --micro-batches 8 --runs "${MFU_RUNS:-3}" --steps 2 --warmup 1 "${EXTRA[@]}" \
      --json "$J/mfu-8b-tp2.json"
  fi
  unset PYTORCH_CUDA_ALLOC_CONF

  # packed against padded micro-batches on a long-tail mix (the 1b shape)
  step dynamic-batch 600 python3 benchmarks/gpu/dynamic_batch.py --shape 1b --steps 2 --json "$J/dynamic-batch-1b.json"
  # Qwen3-4B's shape colocated with a stock SGLang engine on one GPU, the optimizer state streamed from the
  # host: the memory of every phase; then a layout that cannot fit, refused with its estimate
  local C=(python3 benchmarks/gpu/colocated_step.py --model 4b --backend megatron --mem-fraction 0.6 --model-root "$MODEL_ROOT")
  # three steps and the final save (a 4B with its Adam state: 64 GB on disk), then a run resuming from it
  local CK="${C4B_CKPT:-/tmp/rljob-colocated-4b-ckpt}"
  step colocated-4b 600 "${C[@]}" --steps 3 --offload-optimizer --checkpoint-dir "$CK" --json "$J/colocated-4b-offload.json"
  step colocated-4b-resume 600 "${C[@]}" --steps 3 --offload-optimizer --checkpoint-dir "$CK" --resume-only --resume-steps 1 \
    --json "$J/colocated-4b-resume.json"
  step colocated-4b-refused 300 "${C[@]}" --steps 1 --response-len 4096 --no-recompute --json "$J/colocated-4b-refused.json"
}

suite_modes() {
  two_gpus modes || return 0
  local mode MON=""
  # shellcheck disable=SC2206  # MODE_ARGS: options, split on spaces
  local R=(python3 benchmarks/gpu/rollout_modes.py --steps "${MODE_STEPS:-8}" --batch 32 --n 4 --max-response-len 512
    --workdir /tmp/rljob-modes ${MODE_ARGS:-})
  if [ "${DIAG:-0}" = 1 ]; then
    export RLJOB_STACKS_EVERY_S=60
    ( while true; do
        { date +%T; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
          nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
          ps -eo pid,ppid,etime,pcpu,args --sort=start_time | grep -E "sglang|ray::|rollout_modes|raylet|router" | grep -v grep | cut -c1-220
        } >> "$J/monitor.log" 2>&1; sleep 15; done ) &
    MON=$!
  fi
  # each mode in a process of its own (its own local Ray, its own limit; a mode cut short keeps the steps
  # it finished in its JSON)
  for mode in ${MODES:-sync one-step-off buffer2 partial partial-async}; do
    step modes-$mode "${MODE_LIMIT:-900}" "${R[@]}" --modes "$mode" --out "$J/modes-$mode.json"
  done
  if [ -n "$MON" ]; then
    kill "$MON"
    mkdir -p "$J/engines" "$J/ray"
    for d in /tmp/rljob-engines-*; do [ -d "$d" ] && cp -r "$d" "$J/engines/"; done
    cp /tmp/ray/session_latest/logs/*.err "$J/ray/" 2>/dev/null
    find "$J/ray" -size +2M -delete
  fi
  echo "==== steps"; grep -h '^{"mode"' "$LOGS"/modes-*.log 2>/dev/null | cut -c1-200
  local docs=() f
  for f in "$J"/modes-*.json; do [ -f "$f" ] && [ "$f" != "$J/modes-all.json" ] && docs+=("$f"); done
  if (( ${#docs[@]} )); then
    echo "==== report (every mode in $J)"  # pure Python, no GPU
    timeout 60 python3 benchmarks/gpu/rollout_modes.py --out "$J/modes-all.json" --merge "${docs[@]}"
  fi
}

suite_kit() { :; }

"suite_$SUITE" "$@"
summary
echo "logs and results: $RESULTS"
if [ -s "$RESULTS/failed" ]; then
  echo "failed: $(tr '\n' ' ' < "$RESULTS/failed")"
  exit 1
fi
