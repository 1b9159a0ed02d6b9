"""The SGLang HTTP requests the runtime builds, in one place.

Every request body the runtime sends to an engine (real SGLang or our ``hf`` server) is built by a
function here, and every field it may contain is listed in ``REQUEST_BODIES`` against the SGLang
class that parses it. ``tests/unit/test_sglang_contract.py`` checks these lists against SGLang's own
source (``sglang/srt/managers/io_struct.py``, ``server_args.py``), without importing SGLang.

Weight tensors for ``/update_weights_from_tensor`` on the ``hf`` engine (CPU, no CUDA IPC) use a
format of ours, ``serialize_named_tensors``: each string of ``serialized_named_tensors`` is the
base64 of ``torch.save`` of either

- a list of ``(name, tensor)`` pairs (``load_format`` null or ``"direct"``), or
- a dict ``{"flattened_tensor": 1-D tensor, "metadata": [{"name", "shape", "dtype", "start_idx",
  "end_idx", "numel"}...]}`` (``load_format: "flattened_bucket"``, SGLang's bucket layout),

read back with ``torch.load(weights_only=True)``. Names are Hugging Face parameter names.

With ``load_format: "flattened_bucket"`` a string may instead be a CUDA IPC bucket (colocated sync
on GPU, ``sync/cuda_ipc.py``): a ``ForkingPickler`` pickle of the same dict with a CUDA tensor, as
SGLang's ``MultiprocessingSerializer`` writes it; the runtime sends one request per bucket (the list
still holds one string per TP rank, as in SGLang).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# sampling_params keys we send; checked against sglang/srt/sampling/sampling_params.py SamplingParams.
SAMPLING_PARAM_FIELDS: frozenset[str] = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "skip_special_tokens",
        "no_stop_trim",
        "ignore_eos",
        "sampling_seed",
    }
)

# path -> (SGLang class in io_struct.py, fields the runtime may send)
REQUEST_BODIES: dict[str, tuple[str, frozenset[str]]] = {
    "/generate": (
        "GenerateReqInput",
        frozenset(
            {
                "rid",
                "text",
                "input_ids",
                "sampling_params",
                "return_logprob",
                "logprob_start_len",
                "return_routed_experts",
            }
        ),
    ),
    "/abort_request": ("AbortReq", frozenset({"rid", "abort_all"})),
    "/pause_generation": ("PauseGenerationReqInput", frozenset({"mode"})),
    "/continue_generation": ("ContinueGenerationReqInput", frozenset()),
    "/update_weights_from_disk": (
        "UpdateWeightFromDiskReqInput",
        frozenset({"model_path", "load_format", "weight_version", "flush_cache", "abort_all_requests"}),
    ),
    "/update_weights_from_tensor": (
        "UpdateWeightsFromTensorReqInput",
        frozenset({"serialized_named_tensors", "load_format", "flush_cache", "weight_version"}),
    ),
    "/init_weights_update_group": (
        "InitWeightsUpdateGroupReqInput",
        frozenset({"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}),
    ),
    "/update_weights_from_distributed": (
        "UpdateWeightsFromDistributedReqInput",
        frozenset(
            {"names", "dtypes", "shapes", "group_name", "flush_cache", "weight_version", "load_format"}
        ),
    ),
    "/destroy_weights_update_group": ("DestroyWeightsUpdateGroupReqInput", frozenset({"group_name"})),
    "/update_weight_version": (
        "UpdateWeightVersionReqInput",
        frozenset({"new_version", "abort_all_requests"}),
    ),
    "/release_memory_occupation": ("ReleaseMemoryOccupationReqInput", frozenset({"tags"})),
    "/resume_memory_occupation": ("ResumeMemoryOccupationReqInput", frozenset({"tags"})),
}

# `python -m sglang.launch_server` flags the runtime builds; each is `--` + a ServerArgs field in kebab case.
LAUNCH_FLAGS: frozenset[str] = frozenset(
    {
        "model-path",
        "tokenizer-path",
        "host",
        "port",
        "tp-size",
        "dp-size",
        "pp-size",
        "ep-size",
        "base-gpu-id",
        "enable-memory-saver",
        "mem-fraction-static",
        "skip-server-warmup",
        "random-seed",
        "dtype",
        "trust-remote-code",
        "context-length",
        "log-level",
        "served-model-name",
    }
)

DEFAULT_WEIGHT_VERSION = "default"

# ``/server_info`` answers a list ``internal_states``, one entry per data-parallel scheduler; this key
# of each is how many requests that scheduler runs at once (SGLang's ``Scheduler.get_internal_state``).
RUNNING_CAPACITY_KEY = "effective_max_running_requests_per_dp"


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if value is not None}


def sampling_params(
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float | None = None,
    max_new_tokens: int = 128,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    skip_special_tokens: bool = True,
    no_stop_trim: bool = False,
    ignore_eos: bool | None = None,
    sampling_seed: int | None = None,
) -> dict[str, Any]:
    body = _drop_none(
        {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "max_new_tokens": max_new_tokens,
            "stop": list(stop) if isinstance(stop, list | tuple) else stop,
            "stop_token_ids": list(stop_token_ids) if stop_token_ids is not None else None,
            "skip_special_tokens": skip_special_tokens,
            "no_stop_trim": no_stop_trim,
            "ignore_eos": ignore_eos,
            "sampling_seed": sampling_seed,
        }
    )
    assert set(body) <= SAMPLING_PARAM_FIELDS
    return body


def generate_body(
    *,
    input_ids: Sequence[int] | None = None,
    text: str | None = None,
    params: Mapping[str, Any] | None = None,
    return_logprob: bool = True,
    rid: str | None = None,
    return_routed_experts: bool = False,
) -> dict[str, Any]:
    """A ``/generate`` body: one prompt as token ids (preferred: no re-tokenization) or text.
    ``return_routed_experts`` (training.routingReplay; the server needs --enable-return-routed-experts):
    the answer's ``meta_info.routed_experts`` holds the experts each token was routed to
    (``routed_experts``)."""
    if (input_ids is None) == (text is None):
        raise ValueError("give exactly one of input_ids and text")
    body = _drop_none(
        {
            "rid": rid,
            "input_ids": list(input_ids) if input_ids is not None else None,
            "text": text,
            "sampling_params": dict(params) if params is not None else sampling_params(),
            "return_logprob": return_logprob,
            "return_routed_experts": True if return_routed_experts else None,
        }
    )
    return body


def routed_experts(record: str, tokens: int) -> torch.Tensor:
    """SGLang's ``meta_info.routed_experts`` (base64 of int32 [tokens - 1, layers, top-k], C order: the
    experts each layer's router chose for every token of prompt + response but the last, which no
    forward pass saw) as int32 [tokens - 1, layers * top-k]. ValueError when it cannot be that."""
    import torch

    raw = base64.b64decode(record)
    rows = tokens - 1
    if rows < 1 or len(raw) % 4 or (len(raw) // 4) % rows:
        raise ValueError(
            f"a routed-experts record of {len(raw)} bytes is not int32 rows for {tokens} - 1 = {rows} tokens "
            "(prompt + response, less the last)"
        )
    return torch.frombuffer(bytearray(raw), dtype=torch.int32).view(rows, -1)


def abort_body(*, rid: str | None = None) -> dict[str, Any]:
    """``/abort_request``: one request by ``rid``, or all of them."""
    return {"rid": rid} if rid is not None else {"abort_all": True}


def pause_body(mode: str | None = None) -> dict[str, Any]:
    """``/pause_generation``; SGLang's default mode is ``abort`` (in-flight requests finish as aborted)."""
    return _drop_none({"mode": mode})


def update_weights_from_disk_body(
    model_path: str, *, weight_version: str | None = None, load_format: str | None = None
) -> dict[str, Any]:
    return _drop_none(
        {"model_path": model_path, "weight_version": weight_version, "load_format": load_format}
    )


def update_weights_from_tensor_body(
    serialized: Sequence[str],
    *,
    load_format: str | None = None,
    weight_version: str | None = None,
    flush_cache: bool = False,
) -> dict[str, Any]:
    """``serialized`` has one string per TP rank of the engine (the ``hf`` engine has one rank)."""
    return {
        "serialized_named_tensors": list(serialized),
        "load_format": load_format,
        "flush_cache": flush_cache,
        **_drop_none({"weight_version": weight_version}),
    }


def init_weights_update_group_body(
    *,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
) -> dict[str, Any]:
    return {
        "master_address": master_address,
        "master_port": master_port,
        "rank_offset": rank_offset,
        "world_size": world_size,
        "group_name": group_name,
        "backend": backend,
    }


def update_weights_from_distributed_body(
    *,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    group_name: str,
    weight_version: str | None = None,
    flush_cache: bool = False,
    load_format: str | None = None,
) -> dict[str, Any]:
    """``load_format: "flattened_bucket"``: the tensors arrive as one broadcast of their bytes back to
    back (SGLang's ``FlattenedTensorBucket``); without it, one broadcast per tensor."""
    return {
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [list(shape) for shape in shapes],
        "group_name": group_name,
        "flush_cache": flush_cache,
        **_drop_none({"weight_version": weight_version, "load_format": load_format}),
    }


def update_weight_version_body(version: str, *, abort_all_requests: bool = False) -> dict[str, Any]:
    """``/update_weight_version``: label the weights an engine serves (samples report it)."""
    return {"new_version": str(version), "abort_all_requests": abort_all_requests}


def destroy_weights_update_group_body(group_name: str) -> dict[str, Any]:
    return {"group_name": group_name}


def memory_occupation_body(tags: Sequence[str] | None = None) -> dict[str, Any]:
    """``/release_memory_occupation`` and ``/resume_memory_occupation`` (no tags: all)."""
    return _drop_none({"tags": list(tags) if tags is not None else None})


def sglang_launch_args(
    *,
    model_path: str,
    host: str,
    port: int,
    tokenizer_path: str | None = None,
    trust_remote_code: bool = False,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    enable_memory_saver: bool = False,
    enable_return_routed_experts: bool = False,
    mem_fraction_static: float | None = None,
    skip_server_warmup: bool = True,
    random_seed: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[str]:
    """Arguments after ``python -m sglang.launch_server`` for one real SGLang engine.

    ``extra`` (the job's ``rollout.sglangArgs`` map) adds ``--key value`` flags; ``True`` adds a bare
    flag, ``False``/``None`` omits it. Keys may be snake or kebab case.
    """
    flags: dict[str, Any] = {
        "model-path": model_path,
        "tokenizer-path": tokenizer_path,
        "trust-remote-code": trust_remote_code,
        "host": host,
        "port": port,
        "tp-size": tp_size,
        "base-gpu-id": base_gpu_id,
        "enable-memory-saver": enable_memory_saver,
        "enable-return-routed-experts": enable_return_routed_experts,
        "mem-fraction-static": mem_fraction_static,
        "skip-server-warmup": skip_server_warmup,
        "random-seed": random_seed,
    }
    for key, value in (extra or {}).items():
        flags[key.replace("_", "-").lstrip("-")] = value
    args: list[str] = []
    for flag, value in flags.items():
        if value is None or value is False:
            continue
        args.append(f"--{flag}")
        if value is not True:
            args.append(str(value))
    return args


def serialize_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], *, flattened_bucket: bool = False
) -> str:
    """Our CPU wire format for ``serialized_named_tensors`` (see the module docstring)."""
    import torch

    pairs = [(name, tensor.detach().cpu().contiguous()) for name, tensor in named_tensors]
    payload: Any
    if flattened_bucket:
        dtypes = {tensor.dtype for _, tensor in pairs}
        if len(dtypes) > 1:
            raise ValueError(f"a flattened bucket holds one dtype, got {sorted(map(str, dtypes))}")
        metadata, start = [], 0
        for name, tensor in pairs:
            metadata.append(
                {
                    "name": name,
                    "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "start_idx": start,
                    "end_idx": start + tensor.numel(),
                    "numel": tensor.numel(),
                }
            )
            start += tensor.numel()
        flat = torch.cat([tensor.reshape(-1) for _, tensor in pairs]) if pairs else torch.empty(0)
        payload = {"flattened_tensor": flat, "metadata": metadata}
    else:
        payload = pairs
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def deserialize_named_tensors(data: str, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """Inverse of ``serialize_named_tensors`` (rljob's CPU format). A ``flattened_bucket`` string may
    instead be a CUDA IPC bucket: the hf engine tells the two apart first (``rollout/hf_weights.py``,
    with ``sync/cuda_ipc.py``)."""
    import torch

    raw = base64.b64decode(data)
    payload = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    if load_format == "flattened_bucket":
        flat = payload["flattened_tensor"]
        return [
            (meta["name"], flat[meta["start_idx"] : meta["end_idx"]].view(*meta["shape"]))
            for meta in payload["metadata"]
        ]
    if load_format not in (None, "direct"):
        raise ValueError(
            f"unsupported load_format {load_format!r} (supported: null, 'direct', 'flattened_bucket')"
        )
    if isinstance(payload, dict):
        return list(payload.items())
    return [(str(name), tensor) for name, tensor in payload]


def running_capacity(server_info: Any) -> int | None:
    """Requests an engine runs at once, from its ``/server_info`` answer: the sum over its
    data-parallel schedulers of ``RUNNING_CAPACITY_KEY``; None when the answer does not say (the
    ``hf`` engine, another server)."""
    states = server_info.get("internal_states") if isinstance(server_info, dict) else None
    if not isinstance(states, list):
        return None
    values = [s.get(RUNNING_CAPACITY_KEY) for s in states if isinstance(s, dict)]
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if not counts or len(counts) != len(states):
        return None
    return sum(counts)
