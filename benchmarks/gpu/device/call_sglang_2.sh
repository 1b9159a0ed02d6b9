# nvidia-h200-x2, the second call (carry .gpu/sh): the work that needs both GPUs first (NCCL into SGLang:
# every sync against a fresh server, an engine killed in a broadcast; the disaggregated and async examples
# scaled down), then one stream per GPU: the IPC weight sync into SGLang (0.5B/1.5B/4B) and the rollout
# throughput of the runtime's path against stock SGLang (0.5B).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j
T="python3 -m pytest -q -s -p no:cacheprovider --basetemp=/tmp/pt-main"  # two streams: each its own basetemp
G=tests/gpu
step nccl 260 $T $G/test_sglang_nccl.py
step examples-2gpu 170 $T "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-disaggregated.yaml]" \
  "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-async.yaml]"
(
  export CUDA_VISIBLE_DEVICES=0 SYNC_LIMIT=90
  sync_models ipc 0.5b 1.5b 4b
) &
(
  export CUDA_VISIBLE_DEVICES=1; T=${T/pt-main/pt-g1}
  step g1-throughput-0.5b 200 python3 benchmarks/gpu/rollout_throughput.py THROUGHPUT_ARGS_0_5B
) &
wait
pack
summary
