# nvidia-h100-x1, the call that carries the kit's last part (carry .gpu/sh .gpu/pN, after the calls
# carrying .gpu/p1 ... .gpu/pN-1; README.md) (session 6): the chunked LM head's GPU test, then
# the 4b on one 80 GB H100 with the chunked head and full recompute: every layer, then the first 18
# and the first 26 of 36 layers only (the rest keep their activations).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
step lmhead 90 python3 -m pytest tests/gpu/test_megatron_lm_head_gpu.py -q -p no:cacheprovider
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU4="python3 benchmarks/gpu/megatron_mfu.py --models 4b --fusions wgrad,norm,rope --micro-batches 8 --steps 3 --warmup 1 --lm-head chunked --recompute full"
step mfu4 150 $MFU4 --json $J/mfu-4b-chunked-all.json
step mfu4 150 $MFU4 --recompute-layers 18 --json $J/mfu-4b-chunked-k18.json
step mfu4 150 $MFU4 --recompute-layers 26 --json $J/mfu-4b-chunked-k26.json
tail -3 $OUT/lmhead.log; grep -E "^\| 4b|rc=" $OUT/mfu4.log
