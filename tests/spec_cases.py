"""Shared test cases for the RLTrainingJob spec rules.

The same table drives the unit tests (pydantic models, CEL evaluated in Python) and the e2e tests
(the real API server), so both sides are held to the same verdicts and messages.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

# A valid 8-GPU colocated GRPO spec: every case below changes it in one place.
BASE_SPEC: dict[str, Any] = {
    "model": {"path": "Qwen/Qwen3-4B"},
    "data": {"path": "/data/train.jsonl"},
    "rollout": {"batchSize": 32, "nSamplesPerPrompt": 8},
    "training": {"globalBatchSize": 256},
    "resources": {"trainer": {"nodes": 1, "gpusPerNode": 8}},
}


def patched(patch: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Deep-merge `patch` into a copy of the base spec (dicts merge, None deletes, the rest replaces)."""
    out = copy.deepcopy(BASE_SPEC if base is None else base)
    _merge(out, patch)
    return out


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


@dataclass(frozen=True)
class Case:
    """An invalid spec: `patch` over BASE_SPEC; the error must name `path` and contain `message`."""

    name: str
    patch: dict[str, Any]
    path: str
    message: str
    valid_patch: dict[str, Any] = field(default_factory=dict)  # a nearby spec that passes the same rule


RULE_CASES = [
    Case(
        "batch-identity",
        {"rollout": {"batchSize": 30}},
        "spec.training.globalBatchSize",
        "rollout.batchSize * rollout.nSamplesPerPrompt must be a multiple of training.globalBatchSize",
        {"rollout": {"batchSize": 64}},
    ),
    Case(
        "model-parallel-divides-trainer-gpus",
        {"training": {"parallelism": {"tensor": 3}}},
        "spec.training.parallelism",
        "training.parallelism tensor * pipeline * context must divide the trainer GPUs",
        {"training": {"parallelism": {"tensor": 2, "pipeline": 2}, "globalBatchSize": 64}},
    ),
    # What the runtime does not run yet (api/rljob_api/support.py): one case per limit.
    Case(
        "expert-parallel-not-yet",
        {"training": {"parallelism": {"expert": 2}}},
        "spec.training.parallelism.expert",
        "not supported by this runtime yet: training.parallelism.expert above 1",
        {"training": {"parallelism": {"expert": 1}}},
    ),
    Case(
        "routing-replay-not-yet-on-gpus",
        {"training": {"routingReplay": True}},
        "spec.training.routingReplay",
        "not supported by this runtime yet: training.routingReplay (routing replay is not yet shown on GPUs",
        {"training": {"routingReplay": False}},
    ),
    Case(
        "routing-replay-needs-megatron-and-sglang",
        {"training": {"routingReplay": True, "backend": "torch"}},
        "spec.training.routingReplay",
        "not supported by this runtime yet: training.routingReplay with training.backend torch or "
        "rollout.engine hf",
        {"training": {"routingReplay": False, "backend": "torch"}},  # True: refused as not yet on GPUs
    ),
    Case(
        "routing-replay-not-with-custom-generate",
        {"training": {"routingReplay": True}, "rollout": {"customGenerate": "my_pkg.turns:generate"}},
        "spec.training.routingReplay",
        "not supported by this runtime yet: training.routingReplay with rollout.customGenerate",
        {"training": {"routingReplay": False}, "rollout": {"customGenerate": "my_pkg.turns:generate"}},
    ),
    Case(
        "routing-replay-not-with-partial-rollout",
        {
            "training": {"routingReplay": True},
            "rollout": {"partialRollout": True},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
        "spec.training.routingReplay",
        "not supported by this runtime yet: training.routingReplay with rollout.partialRollout",
        {
            "training": {"routingReplay": False},
            "rollout": {"partialRollout": True},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
    ),
    Case(
        "routing-replay-not-with-pipeline-recompute",
        {
            "training": {
                "routingReplay": True,
                "recomputeActivations": True,
                "parallelism": {"pipeline": 2},
                "globalBatchSize": 128,
            }
        },
        "spec.training.routingReplay",
        "not supported by this runtime yet: training.routingReplay with recomputeActivations and "
        "training.parallelism.pipeline above 1",
        {
            "training": {
                "routingReplay": False,
                "recomputeActivations": True,
                "parallelism": {"pipeline": 2},
                "globalBatchSize": 128,
            }
        },
    ),
    Case(  # a sample is never truncated: the budget must hold maxResponseLen + one prompt token at least
        "dynbatch-budget-below-longest-response",
        {"training": {"dynamicBatch": {"enabled": True, "maxTokensPerGpu": 1024}}},
        "spec.training.dynamicBatch.maxTokensPerGpu",
        "training.dynamicBatch.maxTokensPerGpu must hold the longest sample, data.maxPromptLength (1 when "
        "unset) + rollout.maxResponseLen tokens",
        {"training": {"dynamicBatch": {"enabled": True, "maxTokensPerGpu": 1025}}},
    ),
    Case(
        "dynbatch-budget-below-longest-sample",
        {
            "data": {"maxPromptLength": 512},
            "training": {"dynamicBatch": {"enabled": True, "maxTokensPerGpu": 1535}},
        },
        "spec.training.dynamicBatch.maxTokensPerGpu",
        "raise it, or lower rollout.maxResponseLen or data.maxPromptLength",
        {
            "data": {"maxPromptLength": 512},
            "training": {"dynamicBatch": {"enabled": True, "maxTokensPerGpu": 1536}},
        },
    ),
    Case(
        "offload-optimizer-torch-backend",
        {"training": {"backend": "torch", "offloadOptimizer": True}},
        "spec.training.offloadOptimizer",
        "training.offloadOptimizer moves the megatron backend's optimizer state",
        {"training": {"offloadOptimizer": True}},
    ),
    Case(
        "offload-optimizer-on-cpu",
        {
            "training": {"backend": "torch", "offloadOptimizer": True},
            "rollout": {"engine": "hf"},
            "resources": {"device": "cpu"},
        },
        "spec.training.offloadOptimizer",
        "it needs training.backend megatron and resources.device cuda",
        {"training": {"backend": "torch"}, "rollout": {"engine": "hf"}, "resources": {"device": "cpu"}},
    ),
    Case(
        "megatron-args-torch-backend",
        {"training": {"backend": "torch", "megatronArgs": {"overlap-grad-reduce": ""}}},
        "spec.training.megatronArgs",
        "not supported by this runtime yet: training.megatronArgs with training.backend torch",
        {"training": {"megatronArgs": {"overlap-grad-reduce": ""}}},
    ),
    Case(
        "fusions-torch-backend",
        {"training": {"backend": "torch", "fusions": ["wgrad"]}},
        "spec.training.fusions",
        "not supported by this runtime yet: training.fusions with training.backend torch",
        {"training": {"fusions": ["wgrad"]}},
    ),
    Case(
        "lm-head-torch-backend",
        {"training": {"backend": "torch", "lmHead": "full"}},
        "spec.training.lmHead",
        "not supported by this runtime yet: training.lmHead with training.backend torch",
        {"training": {"lmHead": "full"}},
    ),
    Case(
        "fusions-named-once",
        {"training": {"fusions": ["norm", "norm"]}},
        "spec.training.fusions",
        "fusions names each fusion once",
        {"training": {"fusions": ["norm"]}},
    ),
    Case(
        "megatron-args-unknown-option",
        {"training": {"megatronArgs": {"overlap-grad-reduce": "", "use-distributed-optimizer": ""}}},
        "spec.training.megatronArgs",
        "megatronArgs takes only these Megatron options (without the leading dashes): overlap-grad-reduce, "
        "ddp-bucket-size,",
        {"training": {"megatronArgs": {"overlap-grad-reduce": ""}}},
    ),
    Case(
        "megatron-args-bool-value",
        {"training": {"megatronArgs": {"check-for-nan-in-loss-and-grad": "yes"}}},
        "spec.training.megatronArgs",
        "megatronArgs overlap-grad-reduce, check-for-nan-in-loss-and-grad take '' or 'true' (on) or 'false'",
        {"training": {"megatronArgs": {"check-for-nan-in-loss-and-grad": "false"}}},
    ),
    Case(
        "megatron-args-int-value",
        {"training": {"megatronArgs": {"overlap-grad-reduce": "", "ddp-bucket-size": "4e7"}}},
        "spec.training.megatronArgs",
        "megatronArgs ddp-bucket-size, recompute-num-layers take a positive integer",
        {"training": {"megatronArgs": {"overlap-grad-reduce": "", "ddp-bucket-size": "40000000"}}},
    ),
    Case(
        "megatron-args-choice-value",
        {"training": {"megatronArgs": {"recompute-granularity": "partial"}}},
        "spec.training.megatronArgs",
        "megatronArgs: recompute-granularity is full or selective; recompute-method is uniform or block",
        {"training": {"megatronArgs": {"recompute-granularity": "selective"}}},
    ),
    Case(
        "megatron-args-and-recompute-activations",
        {"training": {"recomputeActivations": True, "megatronArgs": {"recompute-granularity": "selective"}}},
        "spec.training.megatronArgs",
        "megatronArgs recompute-* set the recompute that recomputeActivations turns on",
        {"training": {"recomputeActivations": False, "megatronArgs": {"recompute-granularity": "selective"}}},
    ),
    Case(
        "megatron-args-recompute-method-needs-full",
        {"training": {"megatronArgs": {"recompute-granularity": "selective", "recompute-method": "block"}}},
        "spec.training.megatronArgs",
        "megatronArgs recompute-method and recompute-num-layers need recompute-granularity full",
        {"training": {"megatronArgs": {"recompute-granularity": "full", "recompute-method": "block"}}},
    ),
    Case(
        "megatron-args-bucket-needs-overlap",
        {"training": {"megatronArgs": {"overlap-grad-reduce": "false", "ddp-bucket-size": "100"}}},
        "spec.training.megatronArgs",
        "megatronArgs ddp-bucket-size needs overlap-grad-reduce",
        {"training": {"megatronArgs": {"overlap-grad-reduce": "true", "ddp-bucket-size": "100"}}},
    ),
    Case(
        "sequence-parallel-not-yet-on-gpus",
        {"training": {"parallelism": {"sequenceParallel": True, "tensor": 2}}},
        "spec.training.parallelism.sequenceParallel",
        "not supported by this runtime yet: training.parallelism.sequenceParallel (sequence parallelism is "
        "not yet shown on GPUs",
        {"training": {"parallelism": {"tensor": 2}}},
    ),
    Case(
        "sequence-parallel-needs-tensor-parallel",
        {"training": {"parallelism": {"sequenceParallel": True}}},
        "spec.training.parallelism.sequenceParallel",
        "not supported by this runtime yet: training.parallelism.sequenceParallel at "
        "training.parallelism.tensor 1",
        {"training": {"parallelism": {"sequenceParallel": False}}},
    ),
    Case(
        "sequence-parallel-not-with-a-critic",
        {
            "training": {"parallelism": {"sequenceParallel": True, "tensor": 2}},
            "algorithm": {"advantageEstimator": "ppo"},
        },
        "spec.training.parallelism.sequenceParallel",
        "not supported by this runtime yet: training.parallelism.sequenceParallel with "
        "algorithm.advantageEstimator ppo",
        {"training": {"parallelism": {"tensor": 2}}, "algorithm": {"advantageEstimator": "ppo"}},
    ),
    Case(
        "megatron-checkpoint-torch-backend",
        {"model": {"megatronCheckpoint": "/ckpt/torch_dist"}, "training": {"backend": "torch"}},
        "spec.model.megatronCheckpoint",
        "not supported by this runtime yet: model.megatronCheckpoint with training.backend torch",
        {"model": {"megatronCheckpoint": "/ckpt/torch_dist"}},
    ),
    Case(
        "async-settings-need-async",
        {"rollout": {"async": {"bufferSize": 2}}},
        "spec.rollout.async.enabled",
        "rollout.async.bufferSize and rollout.async.updateWeightsInterval apply only with rollout.async.enabled",
        {
            "rollout": {"async": {"enabled": True, "bufferSize": 2}},
            "resources": {"colocate": False, "rollout": {"gpus": 8}},
        },
    ),
    Case(
        "partial-rollout-needs-something-to-abort",
        {"rollout": {"partialRollout": True}},
        "spec.rollout.partialRollout",
        "rollout.partialRollout needs algorithm.dynamicSampling.enabled",
        {"rollout": {"partialRollout": True}, "algorithm": {"dynamicSampling": {"enabled": True}}},
    ),
    Case(
        "partial-rollout-not-with-a-generate-hook",
        {
            "rollout": {"partialRollout": True, "customGenerate": "tools.agent:generate"},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
        "spec.rollout.partialRollout",
        "rollout.partialRollout cannot be used with rollout.customGenerate",
        {
            "rollout": {"customGenerate": "tools.agent:generate"},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
    ),
    Case(
        "mask-off-policy-needs-partial-rollout",
        {"rollout": {"maskOffPolicyPartialTokens": True}},
        "spec.rollout.maskOffPolicyPartialTokens",
        "rollout.maskOffPolicyPartialTokens needs rollout.partialRollout true",
        {
            "rollout": {"maskOffPolicyPartialTokens": True, "partialRollout": True},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
    ),
    Case(
        "custom-filter-needs-dynamic-sampling",
        {"rollout": {"customFilter": "filters.mine:keep"}},
        "spec.rollout.customFilter",
        "rollout.customFilter filters the groups of algorithm.dynamicSampling",
        {
            "rollout": {"customFilter": "filters.mine:keep"},
            "algorithm": {"dynamicSampling": {"enabled": True}},
        },
    ),
    Case(
        "export-needs-checkpoint-volume",
        {"checkpoint": {"export": {"huggingFace": True}}},
        "spec.checkpoint.export",
        "checkpoint.export needs checkpoint.volume",
        {"checkpoint": {"export": {"huggingFace": True}, "volume": {"claimName": "ckpt"}}},
    ),
    Case(
        "export-path-on-a-volume",
        {"checkpoint": {"volume": {"claimName": "ckpt"}, "export": {"steps": [1], "path": "/scratch/hf"}}},
        "spec.checkpoint.export.path",
        "checkpoint.export.path must lie below checkpoint.path or below the mountPath of a writable "
        "persistentVolumeClaim",
        {
            "checkpoint": {
                "volume": {"claimName": "ckpt"},
                "export": {"steps": [1], "path": "/shared/out/hf"},
            },
            "resources": {
                "volumes": [
                    {"name": "out", "mountPath": "/shared/out", "persistentVolumeClaim": {"claimName": "o"}}
                ]
            },
        },
    ),
    Case(
        "export-steps-within-the-run",
        {"checkpoint": {"volume": {"claimName": "ckpt"}, "export": {"steps": [101]}}},
        "spec.checkpoint.export.steps",
        "every step must be at most training.numRollout",
        {"checkpoint": {"volume": {"claimName": "ckpt"}, "export": {"steps": [100]}}},
    ),
    Case(
        "context-parallel-not-yet",
        {"training": {"parallelism": {"context": 2}}},
        "spec.training.parallelism",
        "not supported by this runtime yet: training.parallelism context above 1 with training.backend "
        "megatron (context parallelism needs TransformerEngine's attention); set it to 1",
        {"training": {"parallelism": {"context": 1, "tensor": 2}}},
    ),
    Case(
        "torch-backend-is-data-parallel-only",
        {"training": {"backend": "torch", "parallelism": {"tensor": 2}}},
        "spec.training.parallelism",
        "not supported by this runtime yet: training.parallelism tensor, pipeline or context above 1 with "
        "training.backend torch (data parallel only); set them to 1 (training.backend megatron runs tensor "
        "or pipeline parallelism)",
        {"training": {"backend": "torch"}},
    ),
    Case(
        "cpu-device-needs-hf-and-torch",
        {"resources": {"device": "cpu"}},
        "spec.resources.device",
        "not supported by this runtime yet: resources.device cpu with rollout.engine other than hf or "
        "training.backend other than torch; on cpu use rollout.engine hf and training.backend torch",
        {"resources": {"device": "cpu"}, "rollout": {"engine": "hf"}, "training": {"backend": "torch"}},
    ),
    Case(
        "async-needs-disaggregated",
        {"rollout": {"async": {"enabled": True}}},
        "spec.rollout.async.enabled",
        "not supported by this runtime yet: rollout.async.enabled when colocated",
        {"rollout": {"async": {"enabled": True}}, "resources": {"colocate": False, "rollout": {"gpus": 8}}},
    ),
    Case(
        "colocated-cuda-on-one-node",
        {"resources": {"trainer": {"nodes": 2}}},
        "spec.resources.colocate",
        "not supported by this runtime yet: resources.colocate true with more than 1 trainer node on cuda",
        {"resources": {"colocate": False, "trainer": {"nodes": 2}, "rollout": {"gpus": 8}}},
    ),
    Case(
        "dynamic-sampling-needs-groups",
        {
            "algorithm": {"dynamicSampling": {"enabled": True}},
            "rollout": {"nSamplesPerPrompt": 1},
            "training": {"globalBatchSize": 32},
        },
        "spec.algorithm.dynamicSampling.enabled",
        "algorithm.dynamicSampling needs rollout.nSamplesPerPrompt >= 2",
        {
            "algorithm": {"dynamicSampling": {"enabled": True}},
            "rollout": {"nSamplesPerPrompt": 2},
            "training": {"globalBatchSize": 64},
        },
    ),
    Case(
        "sglang-args-owned-flag",
        {"rollout": {"sglangArgs": {"tp_size": "2"}}},
        "spec.rollout.sglangArgs",
        "rollout.sglangArgs must not set tp-size: the runtime sets it from resources.rollout.gpusPerEngine",
        {"rollout": {"sglangArgs": {"mem-fraction-static": "0.7", "enable-metrics": ""}}},
    ),
    Case(
        "sglang-args-port",
        {"rollout": {"sglangArgs": {"port": "30000"}}},
        "spec.rollout.sglangArgs",
        "rollout.sglangArgs must not set port: the runtime picks a free port",
    ),
    Case(
        "sglang-args-key-with-dashes",
        {"rollout": {"sglangArgs": {"--context-length": "8192"}}},
        "spec.rollout.sglangArgs",
        "rollout.sglangArgs keys are SGLang flag names without the leading dashes",
        {"rollout": {"sglangArgs": {"context-length": "8192"}}},
    ),
    Case(
        "global-batch-fills-micro-batches",  # (ok-<name> stays within 47 characters)
        {"training": {"microBatchSize": 3}},
        "spec.training.globalBatchSize",
        "training.globalBatchSize must be a multiple of training.microBatchSize * data-parallel size",
        {"training": {"microBatchSize": 4}},
    ),
    Case(
        "over-sampling-at-least-batch",
        {"algorithm": {"dynamicSampling": {"enabled": True, "overSamplingBatchSize": 16}}},
        "spec.algorithm.dynamicSampling.overSamplingBatchSize",
        "algorithm.dynamicSampling.overSamplingBatchSize must be at least rollout.batchSize",
        {"algorithm": {"dynamicSampling": {"enabled": True, "overSamplingBatchSize": 64}}},
    ),
    Case(
        "colocated-rollout-gpus-equal-trainer",
        {"resources": {"rollout": {"gpus": 4}}},
        "spec.resources.rollout.gpus",
        "with colocate true, rollout.gpus must equal the trainer GPUs",
        {"resources": {"rollout": {"gpus": 8}}},
    ),
    Case(
        "disaggregated-needs-rollout-gpus",
        {"resources": {"colocate": False}},
        "spec.resources.rollout.gpus",
        "rollout.gpus is required when colocate is false",
        {"resources": {"colocate": False, "rollout": {"gpus": 4}}},
    ),
    Case(
        "gpus-per-engine-divides-rollout-gpus",
        {"resources": {"rollout": {"gpusPerEngine": 3}}},
        "spec.resources.rollout.gpusPerEngine",
        "rollout.gpusPerEngine must divide the rollout GPUs",
        {"resources": {"rollout": {"gpusPerEngine": 4}}},
    ),
    Case(
        "rollout-pods-are-alike",
        {"resources": {"colocate": False, "rollout": {"gpus": 12, "gpusPerNode": 8}}},
        "spec.resources.rollout.gpus",
        "rollout.gpus must be at most rollout.gpusPerNode or a multiple of it",
        {"resources": {"colocate": False, "rollout": {"gpus": 16, "gpusPerNode": 8}}},
    ),
    Case(
        "engine-fits-in-one-pod",
        {"resources": {"colocate": False, "rollout": {"gpus": 8, "gpusPerNode": 4, "gpusPerEngine": 8}}},
        "spec.resources.rollout.gpusPerEngine",
        "rollout.gpusPerEngine must divide the GPUs of one pod",
        {"resources": {"colocate": False, "rollout": {"gpus": 8, "gpusPerNode": 4, "gpusPerEngine": 4}}},
    ),
    Case(
        "eps-clip-high-at-least-eps-clip",
        {"algorithm": {"epsClipHigh": 0.1}},
        "spec.algorithm.epsClipHigh",
        "epsClipHigh must be at least epsClip",
        {"algorithm": {"epsClipHigh": 0.28}},
    ),
    Case(
        "kl-loss-needs-coefficient",
        {"algorithm": {"useKLLoss": True}},
        "spec.algorithm.klLossCoef",
        "useKLLoss is true but klLossCoef is 0",
        {"algorithm": {"useKLLoss": True, "klLossCoef": 0.001}},
    ),
    Case(
        "tis-clip-low-below-high",
        {"algorithm": {"tis": {"enabled": True, "clipLow": 3.0}}},
        "spec.algorithm.tis.clipLow",
        "clipLow must be below clipHigh",
        {"algorithm": {"tis": {"enabled": True, "clipLow": 0.5}}},
    ),
    Case(
        "min-lr-at-most-lr",
        {"training": {"optimizer": {"lr": 1e-6, "minLr": 1e-5}}},
        "spec.training.optimizer.minLr",
        "minLr must not exceed lr",
        {"training": {"optimizer": {"lr": 1e-6, "minLr": 1e-7}}},
    ),
    Case(
        "remote-reward-needs-url",
        {"reward": {"type": "remote"}},
        "spec.reward.url",
        "url is required when type is remote",
        {"reward": {"type": "remote", "url": "http://rewards.default.svc:8000/score"}},
    ),
    Case(
        "custom-reward-needs-function",
        {"reward": {"type": "custom"}},
        "spec.reward.function",
        "function is required when type is custom",
        {"reward": {"type": "custom", "function": "my_rewards.math:score"}},
    ),
    Case(
        "eval-interval-needs-datasets",
        {"data": {"eval": {"interval": 10}}},
        "spec.data.eval.datasets",
        "interval > 0 needs at least one entry in datasets",
        {"data": {"eval": {"interval": 10, "datasets": [{"name": "aime", "path": "/data/aime.jsonl"}]}}},
    ),
    Case(
        "toleration-exists-has-no-value",
        {"resources": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}]}},
        "spec.resources.tolerations[0].value",
        "value must be empty when operator is Exists",
        {"resources": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}},
    ),
    Case(
        "env-value-or-value-from",
        {
            "resources": {
                "env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
            }
        },
        "spec.resources.env[0].valueFrom",
        "set value or valueFrom, not both",
        {"resources": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}},
    ),
    Case(
        "env-source-exactly-one",
        {"resources": {"env": [{"name": "A", "valueFrom": {}}]}},
        "spec.resources.env[0].valueFrom.secretKeyRef",
        "set exactly one of secretKeyRef and configMapKeyRef",
        {"resources": {"env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}},
    ),
]

# Schema constraints (types, ranges, enums, patterns, unknown fields), refused field by field.
SCHEMA_CASES = [
    Case(
        "negative-batch",
        {"rollout": {"batchSize": 0}},
        "spec.rollout.batchSize",
        "greater than or equal to 1",
    ),
    Case(
        "unknown-estimator",
        {"algorithm": {"advantageEstimator": "dpo"}},
        "spec.algorithm.advantageEstimator",
        "grpo",
    ),
    Case("unknown-engine", {"rollout": {"engine": "vllm"}}, "spec.rollout.engine", "sglang"),
    Case(  # the runtime needs time to finish its step and save it
        "grace-period-too-short",
        {"faultTolerance": {"terminationGracePeriodSeconds": 5}},
        "spec.faultTolerance.terminationGracePeriodSeconds",
        "greater than or equal to 10",
    ),
    Case("bad-quantity", {"resources": {"head": {"memory": "lots"}}}, "spec.resources.head.memory", ""),
    Case("bad-queue-name", {"queueName": "Team_A"}, "spec.queueName", ""),
    Case("temperature-range", {"rollout": {"temperature": -1.0}}, "spec.rollout.temperature", ""),
    Case(
        "sglang-arg-value-adds-a-flag",
        {"rollout": {"sglangArgs": {"context-length": "8192 --port 1"}}},
        "spec.rollout.sglangArgs.context-length",
        "",
    ),
    Case(
        "sglang-arg-value-leading-dash",
        {"rollout": {"sglangArgs": {"log-level": "-v"}}},
        "spec.rollout.sglangArgs.log-level",
        "",
    ),
    Case("missing-model-path", {"model": {"path": None}}, "spec.model.path", ""),
    Case("misspelt-field", {"rollout": {"batchsize": 32}}, "spec.rollout.batchsize", ""),
    Case(
        "duplicate-eval-names",
        {
            "data": {
                "eval": {
                    "datasets": [{"name": "aime", "path": "/a.jsonl"}, {"name": "aime", "path": "/b.jsonl"}]
                }
            }
        },
        "spec.data.eval.datasets",
        "",
    ),
    # Strict types, as the API server's structural schema: no string for a number, no number for a bool.
    Case("string-for-integer", {"rollout": {"batchSize": "32"}}, "spec.rollout.batchSize", ""),
    Case("string-for-number", {"rollout": {"temperature": "0.7"}}, "spec.rollout.temperature", ""),
    Case("integer-for-boolean", {"resources": {"colocate": 1}}, "spec.resources.colocate", ""),
    Case("fraction-for-integer", {"training": {"numRollout": 2.5}}, "spec.training.numRollout", ""),
    Case(
        "gpus-per-node-range",
        {"resources": {"trainer": {"gpusPerNode": 0}}},
        "spec.resources.trainer.gpusPerNode",
        "",
    ),
]

# Immutable fields: (name, patch applied as an update, path named in the error).
IMMUTABLE_CASES = [
    Case("model", {"model": {"path": "Qwen/Qwen3-8B"}}, "spec.model", "cannot be changed"),
    Case("data-path", {"data": {"path": "/data/other.jsonl"}}, "spec.data.path", "cannot be changed"),
    Case("backend", {"training": {"backend": "torch"}}, "spec.training.backend", "cannot be changed"),
    Case(
        "parallelism",
        {"training": {"parallelism": {"tensor": 2}}},
        "spec.training.parallelism",
        "cannot be changed",
    ),
    Case("engine", {"rollout": {"engine": "hf"}}, "spec.rollout.engine", "cannot be changed"),
    Case(
        "colocate",
        {"resources": {"colocate": False, "rollout": {"gpus": 8}}},
        "spec.resources.colocate",
        "cannot be changed",
    ),
    Case(
        "trainer-nodes",  # (two colocated cuda nodes are not supported: the layout changes too)
        {"resources": {"trainer": {"nodes": 2}, "colocate": False, "rollout": {"gpus": 8}}},
        "spec.resources.trainer.nodes",
        "cannot be changed",
    ),
    Case("checkpoint-path", {"checkpoint": {"path": "/ckpt2"}}, "spec.checkpoint.path", "cannot be changed"),
    Case(
        "checkpoint-volume",
        {"checkpoint": {"volume": {"claimName": "ckpt"}}},
        "spec.checkpoint.volume",
        "cannot be changed",
    ),
]

# Fields that may change on a live job (take effect on the next start, or at once for scheduling).
MUTABLE_PATCHES = [
    {"suspend": True},
    {"training": {"numRollout": 500}},
    {"training": {"optimizer": {"lr": 2e-6}}},
    {"algorithm": {"klLossCoef": 0.01}},
    {"checkpoint": {"saveInterval": 10}},
    {"ttlSecondsAfterFinished": 3600},
    {"resources": {"priorityClassName": "high"}},
]

# Volumes, labels and env of the pods, and what would fail in the pods or be unsafe there (paths,
# the GPU resource, reserved variables, model references): tables of their own, in both suites.
from spec_cases_ignored import IGNORED_FIELD_CASES  # noqa: E402
from spec_cases_pods import POD_RULE_CASES, POD_SCHEMA_CASES  # noqa: E402
from spec_cases_safety import SAFETY_RULE_CASES  # noqa: E402

RULE_CASES += [Case(*c) for c in POD_RULE_CASES + SAFETY_RULE_CASES + IGNORED_FIELD_CASES]
SCHEMA_CASES += [Case(*c) for c in POD_SCHEMA_CASES]
