"""Prompt data, the Sample record and rewards."""

from .prompts import DataError, EvalDataset, Prompt, PromptSource, load_eval_datasets, parse_prompts
from .sample import Sample, Status

__all__ = [
    "DataError",
    "EvalDataset",
    "Prompt",
    "PromptSource",
    "Sample",
    "Status",
    "load_eval_datasets",
    "parse_prompts",
]
