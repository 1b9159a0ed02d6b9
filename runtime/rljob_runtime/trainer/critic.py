"""The critic (value model) of advantageEstimator ppo for the torch backend.

The base transformer of ``algorithm.critic.path`` (default ``model.path``) with a scalar head per
token: transformers' ``...ForTokenClassification`` with one label and its dropout off (values are
computed in eval mode before training and must match the train-mode forward). A head missing from
the checkpoint (a causal-LM checkpoint) starts at zero, so every rank starts from the same critic
whatever its RNG and the first values are 0; a saved critic (``<checkpoint>/critic``) keeps its head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rljob_api.spec import RLTrainingJobSpec
from rljob_api.spec_training import OptimizerSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CRITIC_DIR = "critic"
CRITIC_FIELD = "algorithm.critic.path"
HEAD_PREFIX = "score."  # GenericForTokenClassification's head


def critic_path(spec: RLTrainingJobSpec, model_path: str) -> str:
    """The critic's initial weights as this process sees them: ``algorithm.critic.path`` (a directory
    or a hub id, which prepare has already downloaded into the cache) or the policy's."""
    from ..models.resolve import resolve_model

    reference = spec.algorithm.critic.path
    return str(resolve_model(reference, field=CRITIC_FIELD)) if reference else model_path


def load_value_model(path: str, *, trust_remote_code: bool = False) -> PreTrainedModel:
    """A float32 value model from ``path`` (an HF directory or hub id), on CPU."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust_remote_code)
    config.classifier_dropout = 0.0
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(
            path,
            config=config,
            dtype=torch.float32,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
        )
    except ValueError as exc:  # an architecture without a token-classification variant
        raise ValueError(f"algorithm.critic: cannot build a value model from {path}: {exc}") from exc
    missing: list[str] = list(info.get("missing_keys", []))
    if any(key.startswith(HEAD_PREFIX) for key in missing):
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.startswith(HEAD_PREFIX):
                    param.zero_()
    model.config.use_cache = False
    return model


def critic_optimizer_spec(spec: RLTrainingJobSpec) -> OptimizerSpec:
    """The policy's optimizer settings and schedule shape at algorithm.critic.lr (minLr scaled alike)."""
    opt = spec.training.optimizer
    lr = spec.algorithm.critic.lr
    return opt.model_copy(update={"lr": lr, "min_lr": opt.min_lr * lr / opt.lr})


def token_values(model: torch.nn.Module, inputs: dict[str, Any], positions: torch.Tensor) -> torch.Tensor:
    """[b, T] float32 values: V at ``positions`` (the position before each response token, the state
    the token is generated from)."""
    out = model(**inputs, use_cache=False)
    scores = out.logits[..., 0].float()  # [b, L]
    return scores.gather(1, positions)
