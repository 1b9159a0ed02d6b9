# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: the megatron group through Ray on two
# GPUs (TP 2), and the trainer rank's TP1 / TP2 / PP2 first step against the torch backend.
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_2gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
step group 240 python3 -m pytest tests/gpu/test_megatron_group.py -q -s -p no:cacheprovider
step backend 200 python3 -m pytest tests/gpu/test_megatron_backend.py -q -s -p no:cacheprovider
grep -v -i warn $OUT/group.log | tail -12; grep -E "passed|failed|rc=" $OUT/backend.log
