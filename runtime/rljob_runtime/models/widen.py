"""Widen a Llama checkpoint (``LlamaForCausalLM``) without changing its function: more hidden dims,
more attention heads (same head_dim and GQA group), more MLP neurons, same layers and vocabulary. The
widened model's logits equal the source's at the start, and every new weight can learn.

Why: a GPU host without network has only SmolLM2-135M; widened to ~2B it starts a large-model GRPO
run from a model that already does the task. ``python -m rljob_runtime.models.widen SRC DST``.

How the function is kept (d -> D hidden dims):

- The residual stream is zero-padded: the embedding (and an untied lm_head) get zero columns, and the
  matrices that write into the residual (o_proj, down_proj) get zero rows, so the new dims stay 0.
- RMSNorm over D dims of such a vector sees mean_D(x²) = (d/D)·mean_d(x²). With eps' = eps·d/D and
  w' = w·sqrt(d/D), x / sqrt(mean_D + eps') · w' = x / sqrt(mean_d + eps) · w on the original dims.
  New dims get the mean of the scaled weights: their input is 0 at the start, and a non-zero weight
  lets gradients reach the new dims (a zero one would keep them dead).
- New query heads come with new KV heads in the same ratio (query head i reads KV head i // group),
  after the original ones; o_proj reads them through zero columns, so they add nothing at first.
- New MLP neurons: down_proj reads them through zero columns.
- Everything that only READS (q/k/v, gate/up: new rows and new input columns) is small seeded noise:
  the new inputs are 0, and noise gives the new parameters gradients (after one step for those behind
  a zero matrix, as with any zero-initialised branch). Biases are zero-padded. RoPE is per head_dim.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_LAYER = re.compile(
    r"model\.layers\.(\d+)\.(?:self_attn\.(?P<attn>[qkvo])_proj|mlp\.(?P<mlp>gate|up|down)_proj)"
    r"\.(?P<kind>weight|bias)"
)
_NORM = re.compile(
    r"model\.layers\.(\d+)\.(?:input_layernorm|post_attention_layernorm)\.weight|model\.norm\.weight"
)
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LlamaShape:
    """The sizes that widening changes (head_dim and the layer count never change)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


@dataclass(frozen=True)
class Widened:
    """What ``widen_checkpoint`` wrote."""

    path: Path
    source_params: int
    target_params: int


def source_shape(config: Mapping[str, Any]) -> LlamaShape:
    """The shape of a Llama config; refuses any other model type."""
    model_type = config.get("model_type")
    if model_type != "llama":
        raise ValueError(
            f"model_type {model_type!r}: only 'llama' checkpoints (LlamaForCausalLM) can be widened"
        )
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    if architectures != ["LlamaForCausalLM"]:
        raise ValueError(f"architectures {architectures!r}: only ['LlamaForCausalLM'] can be widened")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise ValueError(
            f"source num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    return LlamaShape(hidden, heads, kv_heads, head_dim, int(config["intermediate_size"]))


def target_shape(
    source: LlamaShape,
    *,
    hidden_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
) -> LlamaShape:
    """The widened shape, or a ValueError naming the value that cannot keep the source's function."""
    sizes = {
        "hidden_size": (hidden_size, source.hidden_size),
        "num_attention_heads": (num_attention_heads, source.num_attention_heads),
        "num_key_value_heads": (num_key_value_heads, source.num_key_value_heads),
        "intermediate_size": (intermediate_size, source.intermediate_size),
    }
    for name, (new, old) in sizes.items():
        if not isinstance(new, int) or isinstance(new, bool):
            raise ValueError(f"{name} {new!r} is not an integer")
        if new < old:
            raise ValueError(f"{name} {new} is smaller than the source's {old}: widening only grows a model")
    head_dim = source.head_dim
    if hidden_size % head_dim:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of head_dim {head_dim}")
    standard = source.num_attention_heads * head_dim == source.hidden_size
    if standard and num_attention_heads * head_dim != hidden_size:
        # The source follows hidden_size = heads × head_dim, which engines and converters may assume.
        raise ValueError(
            f"num_attention_heads {num_attention_heads} × head_dim {head_dim} = {num_attention_heads * head_dim} "
            f"!= hidden_size {hidden_size} (the source has heads × head_dim = hidden_size; use "
            f"{hidden_size // head_dim} heads)"
        )
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}"
        )
    if num_attention_heads // num_key_value_heads != source.group:
        # Query head i reads KV head i // group: another group size would rewire the original heads.
        raise ValueError(
            f"num_attention_heads / num_key_value_heads = {num_attention_heads}/{num_key_value_heads} changes "
            f"the GQA group from the source's {source.group} to {num_attention_heads // num_key_value_heads}"
        )
    return LlamaShape(hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size)


def widened_config(
    config: Mapping[str, Any], target: LlamaShape, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """The source config with the target sizes and the eps that keeps RMSNorm's output (see the top)."""
    source = source_shape(config)
    new = dict(config)
    new.update(
        hidden_size=target.hidden_size,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim,  # explicit: the source's, whatever hidden / heads is
        intermediate_size=target.intermediate_size,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)) * source.hidden_size / target.hidden_size,
    )
    if dtype is not None:
        new["dtype"] = str(dtype).removeprefix("torch.")
        if "torch_dtype" in new:  # older transformers' name for it
            new["torch_dtype"] = new["dtype"]
    return new


def llama_param_count(config: Mapping[str, Any]) -> int:
    """The parameters of a LlamaForCausalLM with this config (a tied lm_head counted once)."""
    shape = source_shape(config)
    hidden, head_dim, inter = shape.hidden_size, shape.head_dim, shape.intermediate_size
    q, kv = shape.num_attention_heads * head_dim, shape.num_key_value_heads * head_dim
    attn = hidden * q * 2 + hidden * kv * 2 + ((q + 2 * kv + hidden) if config.get("attention_bias") else 0)
    mlp = 3 * hidden * inter + ((2 * inter + hidden) if config.get("mlp_bias") else 0)
    layer = attn + mlp + 2 * hidden
    vocab = int(config["vocab_size"])
    head = 0 if config.get("tie_word_embeddings", False) else vocab * hidden
    return vocab * hidden + head + int(config["num_hidden_layers"]) * layer + hidden


def _noise(shape: tuple[int, ...], name: str, seed: int, std: float) -> torch.Tensor:
    # One generator per tensor, seeded by the seed and its name: the same weights whatever order the
    # tensors come in (the CPU generator keeps 32 bits of a seed, so both go through one crc32).
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.empty(shape).normal_(0.0, std, generator=generator)  # one allocation, no product


def _place(base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``base`` with ``source`` in its leading corner (the original rows and columns come first)."""
    base[tuple(slice(0, n) for n in source.shape)] = source
    return base


def widened_tensors(
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    target: LlamaShape,
    *,
    seed: int = 0,
    init_std: float = 0.02,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The widened tensors one at a time (name order), so a writer needs only the one in hand.

    Computed in float32, returned in ``dtype`` (the source's when None). Refuses unknown names and
    shapes that do not match the config.
    """
    source = source_shape(config)
    layers = int(config["num_hidden_layers"])
    tied = bool(config.get("tie_word_embeddings", False))
    expected = _expected_shapes(config, source)
    missing = sorted(set(expected) - set(state) - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise ValueError(f"the state dict lacks {missing[:3]} ({len(missing)} missing)")
    scale = math.sqrt(source.hidden_size / target.hidden_size)
    for name in sorted(state):
        tensor = state[name]
        if name.endswith("rotary_emb.inv_freq"):  # a buffer of head_dim, unchanged
            yield name, tensor
            continue
        if name not in expected:
            raise ValueError(f"{name}: not a LlamaForCausalLM weight of {layers} layers; cannot widen it")
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the config says {expected[name]}")
        if name == "lm_head.weight" and tied:
            continue  # the embedding is the lm_head
        out_dtype = dtype or tensor.dtype
        yield name, _widen_one(name, tensor.float(), source, target, scale, seed, init_std).to(out_dtype)


def _expected_shapes(config: Mapping[str, Any], shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    hidden, q, kv = (
        shape.hidden_size,
        shape.num_attention_heads * shape.head_dim,
        shape.num_key_value_heads * shape.head_dim,
    )
    vocab, inter = int(config["vocab_size"]), shape.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    per_layer: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (q, hidden),
        "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden),
        "self_attn.o_proj.weight": (hidden, q),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    if config.get("attention_bias"):
        per_layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,)})
        per_layer.update({"self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (hidden,)})
    if config.get("mlp_bias"):
        per_layer.update({"mlp.gate_proj.bias": (inter,), "mlp.up_proj.bias": (inter,)})
        per_layer["mlp.down_proj.bias"] = (hidden,)
    for layer in range(int(config["num_hidden_layers"])):
        shapes.update({f"model.layers.{layer}.{key}": value for key, value in per_layer.items()})
    return shapes


def _widen_one(
    name: str,
    tensor: torch.Tensor,
    source: LlamaShape,
    target: LlamaShape,
    scale: float,
    seed: int,
    std: float,
) -> torch.Tensor:
    hidden = target.hidden_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return _place(tensor.new_zeros(tensor.shape[0], hidden), tensor)
    if _NORM.fullmatch(name):
        scaled = tensor * scale
        return _place(torch.full((hidden,), scaled.mean().item()), scaled)
    match = _LAYER.fullmatch(name)
    if match is None:  # _expected_shapes names nothing else
        raise ValueError(f"{name}: no widening rule")
    q, kv = target.num_attention_heads * target.head_dim, target.num_key_value_heads * target.head_dim
    rows = {
        "q": q,
        "k": kv,
        "v": kv,
        "o": hidden,
        "gate": target.intermediate_size,
        "up": target.intermediate_size,
        "down": hidden,
    }
    part = match["attn"] or match["mlp"]
    if match["kind"] == "bias":  # new heads, neurons and dims start without bias
        return _place(tensor.new_zeros(rows[part]), tensor)
    if part == "o":  # writes the residual; reads the new heads through zero columns
        return _place(tensor.new_zeros(hidden, q), tensor)
    if part == "down":  # writes the residual; reads the new neurons through zero columns
        return _place(tensor.new_zeros(hidden, target.intermediate_size), tensor)
    # q/k/v, gate/up: new heads and neurons after the original ones (query head i reads KV head
    # i // group in both models), noise wherever the source has nothing.
    return _place(_noise((rows[part], hidden), name, seed, std), tensor)


def widen_state_dict(
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    hidden_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    seed: int = 0,
    init_std: float = 0.02,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The widened config and state dict of a Llama checkpoint (see the top for why it is exact).

    Raises ValueError, naming the value, for a target that cannot keep the function.
    """
    target = target_shape(
        source_shape(config),
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
    )
    tensors = dict(widened_tensors(config, state, target, seed=seed, init_std=init_std, dtype=dtype))
    return widened_config(config, target, dtype), tensors


def _read_state(src: Path) -> dict[str, torch.Tensor]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{src}: no model.safetensors or model.safetensors.index.json to widen")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(src / file), framework="pt") as weights:
            state.update({key: weights.get_tensor(key) for key in weights.keys()})  # noqa: SIM118
    return state


def _write_shards(tensors: Iterator[tuple[str, torch.Tensor]], dst: Path, max_shard_bytes: int) -> int:
    """Shards of at most ``max_shard_bytes`` (one bigger tensor alone) plus the HF index; the parameter count."""
    shards: list[dict[str, str]] = []  # per shard: tensor name -> temporary file name
    shard: dict[str, torch.Tensor] = {}
    size = total = params = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            file = f"shard-{len(shards):05d}.tmp"
            save_file(shard, str(dst / file), metadata={"format": "pt"})
            shards.append(dict.fromkeys(shard, file))
            shard, size = {}, 0

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_shard_bytes:
            flush()
        shard[name] = tensor.contiguous()
        size, total, params = size + nbytes, total + nbytes, params + tensor.numel()
    flush()
    # The final names carry the shard count, known only now.
    weight_map: dict[str, str] = {}
    for number, names in enumerate(shards, start=1):
        final = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        )
        (dst / next(iter(names.values()))).rename(dst / final)
        (dst / final).chmod(0o644)  # save_file writes 0600; the directory is world-readable
        weight_map.update(dict.fromkeys(names, final))
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return params


def _is_weights_or_config(name: str) -> bool:
    return name == "config.json" or name.endswith(_WEIGHT_FILES) or name.endswith(".index.json")


def widen_checkpoint(
    src_dir: str | os.PathLike[str],
    dst_dir: str | os.PathLike[str],
    *,
    hidden_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    seed: int = 0,
    init_std: float = 0.02,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 2 * 1024**3,
) -> Widened:
    """Widen the HF directory ``src_dir`` (config.json + safetensors) into a new ``dst_dir``.

    Writes safetensors shards, config.json, and copies every other top-level file (tokenizer, chat
    template, generation config). Holds the source and at most one shard of the target. The
    directory appears only complete (built beside it, then renamed).
    """
    src, dst = Path(src_dir), Path(dst_dir)
    if dst.exists():
        raise FileExistsError(f"{dst} exists; widening writes a new directory")
    config = json.loads((src / "config.json").read_text())
    target = target_shape(
        source_shape(config),
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
    )
    state = _read_state(src)
    out_dtype = dtype or next(iter(state.values())).dtype
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        tensors = widened_tensors(config, state, target, seed=seed, init_std=init_std, dtype=out_dtype)
        target_params = _write_shards(tensors, tmp, max_shard_bytes)
        new_config = widened_config(config, target, out_dtype)
        (tmp / "config.json").write_text(json.dumps(new_config, indent=2, sort_keys=True) + "\n")
        for item in sorted(src.iterdir()):
            if item.is_file() and not item.name.startswith(".") and not _is_weights_or_config(item.name):
                shutil.copy2(item, tmp / item.name)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        tmp.rename(dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    source_params = sum(t.numel() for name, t in state.items() if not name.endswith("inv_freq"))
    if config.get("tie_word_embeddings") and "lm_head.weight" in state:
        source_params -= state["lm_head.weight"].numel()  # the same tensor as the embedding
    return Widened(dst, source_params, target_params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rljob_runtime.models.widen",
        description="Widen a Llama HF checkpoint, keeping its logits (defaults: SmolLM2-135M to ~2B).",
    )
    parser.add_argument("src", type=Path, help="the source HF directory (config.json + safetensors)")
    parser.add_argument("dst", type=Path, help="the new directory to write")
    parser.add_argument("--hidden", type=int, default=2304)
    parser.add_argument("--heads", type=int, default=36)
    parser.add_argument("--kv-heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=6912)
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.02, help="std of the new read weights")
    parser.add_argument("--max-shard-gb", type=float, default=2.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        done = widen_checkpoint(
            args.src,
            args.dst,
            hidden_size=args.hidden,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            intermediate_size=args.intermediate,
            seed=args.seed,
            init_std=args.init_std,
            dtype=_DTYPES[args.dtype],
            max_shard_bytes=int(args.max_shard_gb * 1024**3),
        )
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"widen: {error}", file=sys.stderr)
        return 2
    print(f"source: {done.source_params:,} parameters ({args.src})")
    print(f"target: {done.target_params:,} parameters ({done.path}, {args.dtype})")
    print(f"took {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
