"""Rule cases for fields that would be accepted and then ignored: estimator-specific settings under
another estimator, SGLang flags and tensor parallelism with the hf engine, float16 on megatron.

Tuples of Case's fields (spec_cases turns them into Cases and adds them to its tables, which the
unit tests and the real-API-server suite both run)."""

from __future__ import annotations

from typing import Any

_RETURNS = "is used by advantageEstimator reinforce_plus_plus, reinforce_plus_plus_baseline and ppo only"
_PPO = "is used by advantageEstimator ppo only"
_GROUP = "is used by advantageEstimator grpo and gspo only"
# support.py's limits: their messages begin with support.NOT_YET
_HF_ARGS = "not supported by this runtime yet: rollout.sglangArgs other than max-running-requests with rollout.engine hf"
_HF_TP = "not supported by this runtime yet: resources.rollout.gpusPerEngine above 1 with rollout.engine hf on cuda"
_FP16 = "not supported by this runtime yet: model.dtype float16 with training.backend megatron"


def _algo(**fields: Any) -> dict[str, Any]:
    return {"algorithm": fields}


def _hf(**rollout: Any) -> dict[str, Any]:
    return {"rollout": {"engine": "hf", **rollout}}


_HF_POOL = {"trainer": {"gpusPerNode": 4}, "colocate": False, "rollout": {"gpus": 4}}

IGNORED_FIELD_CASES: list[tuple[Any, ...]] = [
    ("kl-coef-under-grpo", _algo(klCoef=0.1), "spec.algorithm.klCoef", _RETURNS, _algo(klCoef=0.0)),
    (
        "gamma-under-gspo",
        _algo(advantageEstimator="gspo", gamma=0.99),
        "spec.algorithm.gamma",
        _RETURNS,
        _algo(advantageEstimator="reinforce_plus_plus", gamma=0.99),
    ),
    (
        "lambda-under-reinforce",
        _algo(advantageEstimator="reinforce_plus_plus", **{"lambda": 0.95}),
        "spec.algorithm.lambda",
        _PPO,
        {"algorithm": {"advantageEstimator": "ppo", "lambda": 0.95}, "training": {"backend": "torch"}},
    ),
    (
        "critic-under-grpo",
        _algo(critic={"lr": 1e-6}),
        "spec.algorithm.critic",
        _PPO,
        {
            "algorithm": {"advantageEstimator": "ppo", "critic": {"lr": 1e-6}},
            "training": {"backend": "torch"},
        },
    ),
    (
        "critic-path-under-rpp",
        _algo(advantageEstimator="reinforce_plus_plus_baseline", critic={"path": "/models/critic"}),
        "spec.algorithm.critic",
        _PPO,
        _algo(advantageEstimator="reinforce_plus_plus_baseline", critic={}),
    ),
    (
        "normalize-group-std-under-ppo",
        {
            "algorithm": {"advantageEstimator": "ppo", "normalizeGroupStd": False},
            "training": {"backend": "torch"},
        },
        "spec.algorithm.normalizeGroupStd",
        _GROUP,
        _algo(normalizeGroupStd=False),
    ),
    (
        "hf-engine-sglang-flag",
        _hf(sglangArgs={"mem-fraction-static": "0.7"}),
        "spec.rollout.sglangArgs",
        _HF_ARGS,
        _hf(sglangArgs={"max_running_requests": "8"}),
    ),
    (
        "hf-engine-tensor-parallel",
        {**_hf(), "resources": {**_HF_POOL, "rollout": {"gpus": 4, "gpusPerEngine": 2}}},
        "spec.resources.rollout.gpusPerEngine",
        _HF_TP,
        {"resources": {**_HF_POOL, "rollout": {"gpus": 4, "gpusPerEngine": 2}}},
    ),
    (
        "micro-batch-size-with-dynamic-batch",
        {"training": {"microBatchSize": 2, "dynamicBatch": {"enabled": True, "maxTokensPerGpu": 16384}}},
        "spec.training.microBatchSize",
        "training.microBatchSize is not used with training.dynamicBatch.enabled",
        {"training": {"microBatchSize": 1, "dynamicBatch": {"enabled": True, "maxTokensPerGpu": 16384}}},
    ),
    (
        "eval-before-training-without-interval",
        {"data": {"eval": {"beforeTraining": True}}},
        "spec.data.eval.beforeTraining",
        "beforeTraining needs interval > 0",
        {
            "data": {
                "eval": {
                    "beforeTraining": True,
                    "interval": 5,
                    "datasets": [{"name": "d", "path": "/d.jsonl"}],
                }
            }
        },
    ),
    (
        "float16-on-megatron",
        {"model": {"path": "Qwen/Qwen3-4B", "dtype": "float16"}, "training": {"backend": "megatron"}},
        "spec.model.dtype",
        _FP16,
        {"model": {"path": "Qwen/Qwen3-4B", "dtype": "float16"}, "training": {"backend": "torch"}},
    ),
]
