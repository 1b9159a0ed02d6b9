# nvidia-h200-x2, the second call (carry .gpu/sh): the work that needs both GPUs. NCCL into SGLang:
# every sync against a fresh server, an engine killed in a broadcast; the disaggregated and async
# examples scaled down; the NCCL weight sync benchmark (4B first, the target's model).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j
T="python3 -m pytest -q -s -p no:cacheprovider --timeout=240 --basetemp=/tmp/pt-main"
G=tests/gpu
step nccl 240 $T $G/test_sglang_nccl.py
step examples-2gpu 160 $T "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-disaggregated.yaml]" \
  "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-async.yaml]"
SYNC_LIMIT=120 sync_models nccl 4b 0.5b
pack
summary
