"""A short human summary of a spec: what `rljob-runtime validate` prints and events can quote."""

from __future__ import annotations

from .spec import RLTrainingJobSpec, data_parallel_size, trainer_gpus
from .spec_ops import export_root
from .spec_resources import rollout_gpus


def describe(spec: RLTrainingJobSpec) -> list[tuple[str, str]]:
    """(topic, one line) pairs summarising the job."""
    a, r, t, res = spec.algorithm, spec.rollout, spec.training, spec.resources
    unit = "slot" if res.device == "cpu" else "GPU"
    samples = r.batch_size * r.n_samples_per_prompt
    kl = f"KL loss {a.kl_loss_type} x {a.kl_loss_coef:g}" if a.use_kl_loss else "no KL loss"
    clip_high = a.eps_clip_high if a.eps_clip_high is not None else a.eps_clip
    p = t.parallelism
    engines = rollout_gpus(res) // res.rollout.gpus_per_engine
    layout = "colocated" if res.colocate else "disaggregated"
    if r.async_.enabled:
        layout += ", async"
    return [
        (
            "model",
            f"{spec.model.path} ({spec.model.dtype})"
            + (
                "; the operator converts it to a Megatron checkpoint in the model cache first (once per revision)"
                if t.backend == "megatron"
                and res.model_cache is not None
                and spec.model.megatron_checkpoint is None
                else ""
            ),
        ),
        ("data", f"{spec.data.path} (input {spec.data.input_key!r}, label {spec.data.label_key!r})"),
        ("algorithm", f"{a.advantage_estimator}, {kl}, clip [{1 - a.eps_clip:g}, {1 + clip_high:g}]"),
        (
            "rollout",
            f"{r.engine} engine, {r.batch_size} prompts x {r.n_samples_per_prompt} samples = {samples} per step, "
            f"max {r.max_response_len} tokens, temperature {r.temperature:g}"
            + (f", generate hook {r.custom_generate}" if r.custom_generate else ""),
        ),
        (
            "training",
            f"{t.backend} backend, {t.num_rollout} steps, global batch {t.global_batch_size} "
            f"({samples // t.global_batch_size} optimizer step(s) per rollout), lr {t.optimizer.lr:g}",
        ),
        (
            "parallelism",
            f"TP {p.tensor} x PP {p.pipeline} x CP {p.context} x DP {data_parallel_size(spec)}"
            + (f", EP {p.expert}" if p.expert > 1 else ""),
        ),
        (
            "resources",
            f"{res.device}, {layout}, trainer {res.trainer.nodes} x {res.trainer.gpus_per_node} {unit}s "
            f"= {trainer_gpus(spec)}, rollout {rollout_gpus(res)} {unit}s in {engines} engine(s); "
            f"{spec.total_gpus()} GPUs requested",
        ),
        ("reward", spec.reward.type),
        (
            "checkpoint",
            f"{spec.checkpoint.path}, every {spec.checkpoint.save_interval or 'end'}"
            f"{'' if spec.checkpoint.save_interval == 0 else ' steps'}, resume {spec.checkpoint.resume}"
            + ("" if spec.checkpoint.volume else " (no volume: lost with the pods)")
            + _exports(spec),
        ),
    ]


def _exports(spec: RLTrainingJobSpec) -> str:
    export = spec.checkpoint.export
    which = (["the final one"] if export.hugging_face else []) + [f"step {s}" for s in sorted(export.steps)]
    if not which:
        return ""
    return f"; exported as Hugging Face directories to {export_root(spec.checkpoint)}/iter_<step> ({', '.join(which)})"
