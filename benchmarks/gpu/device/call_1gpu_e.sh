# same machine, next call within 30 s, carry .gpu/sh (session 6): the 1b with 8 micro-batches of one
# sequence, then 4 of two sequences (half the launches per token), then that with the chunked head;
# one more 4b, its recompute depth picked from call_1gpu_d's results (fewer recomputed layers if 18
# fitted, more if it did not).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_d.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU1="python3 benchmarks/gpu/megatron_mfu.py --models 1b --fusions wgrad,norm,rope"
step mfu1 100 $MFU1 --micro-batches 8 --json $J/mfu-1b-mb8.json
step mfu1 100 $MFU1 --micro-batches 4 --micro-batch-size 2 --json $J/mfu-1b-b2.json
step mfu1 100 $MFU1 --micro-batches 4 --micro-batch-size 2 --lm-head chunked --json $J/mfu-1b-b2-chunked.json
K=$(python3 - <<'PY'
import json, pathlib
def ok(k):
    p = pathlib.Path(f"/tmp/rljob-json/mfu-4b-chunked-k{k}.json")
    r = json.loads(p.read_text())[0] if p.exists() else {"error": "missing"}
    return "error" not in r, r.get("peak_reserved_gib", 99)
fit18, res18 = ok(18)
fit26, _ = ok(26)
print(12 if fit18 and res18 < 74 else 15 if fit18 else 22 if fit26 else 32)
PY
)
echo "4b: recompute the first $K layers"
MFU4="python3 benchmarks/gpu/megatron_mfu.py --models 4b --fusions wgrad,norm,rope --micro-batches 8 --steps 3 --warmup 1 --lm-head chunked --recompute full"
step mfu4 150 $MFU4 --recompute-layers $K --json $J/mfu-4b-chunked-k$K.json
grep -E "^\| 1b|^\| 4b|rc=" $OUT/mfu1.log $OUT/mfu4.log
