# nvidia-h200-x2, the first call after the kit's 4 carries (carry .gpu/sh): SGLang engines for real.
# Two streams, one per GPU (each test starts its own local Ray and sees one GPU):
#   GPU 0: the engine's flags, memory release and start failures; the IPC codecs against SGLang's own
#          deserializer; the trainer's offload; every colocated sync against a fresh server + kill -9
#          mid-rollout; GRPO learns (torch)
#   GPU 1: GRPO learns (megatron); a stopped run resumes; the colocated step phases of a 1.5B that does
#          not fit with its engine at once; the scaled-down grpo-job example
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j
step kit 90 python3 benchmarks/gpu/device/kit_check.py
T="python3 -m pytest -q -s -p no:cacheprovider --timeout=240 --basetemp=/tmp/pt-main"  # two streams: each its own basetemp
G=tests/gpu
(
  export CUDA_VISIBLE_DEVICES=0; T=${T/pt-main/pt-g0}
  step g0-engine 200 $T $G/test_sglang_engine.py $G/test_cuda_ipc_codec.py $G/test_trainer_offload_gpu.py
  step g0-sync-kill 260 $T "$G/test_sglang_grpo.py::test_every_sync_matches_a_fresh_server_and_a_killed_engine_loses_nothing"
  step g0-learn-torch 200 $T "$G/test_sglang_grpo.py::test_grpo_learns_colocated_with_sglang[torch]"
) &
(
  export CUDA_VISIBLE_DEVICES=1; T=${T/pt-main/pt-g1}
  step g1-learn-megatron 220 $T "$G/test_sglang_grpo.py::test_grpo_learns_colocated_with_sglang[megatron]"
  step g1-resume 160 $T "$G/test_sglang_grpo.py::test_a_stopped_run_resumes_from_its_checkpoint"
  step g1-colocated 170 python3 benchmarks/gpu/colocated_step.py --model 1.5b --backend torch --mem-fraction 0.85 \
    --steps 2 --json $J/colocated-1.5b.json --model-root /dev/shm/rljob-models
  step g1-example-job 100 $T "$G/test_examples_gpu.py::test_a_scaled_down_example_runs[grpo-job.yaml]"
) &
wait
pack
summary
