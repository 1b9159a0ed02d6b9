"""DeepScaleR's verifier: the boxed answer of the part after the reasoning, 1.0 if equivalent to any
of the labels, else 0.0 (no fallback to the last number, unlike ``math``)."""

from __future__ import annotations

from .math_answer import answers_equal, last_boxed


def deepscaler_reward(response: str, label: object) -> float:
    """1.0 when the \\boxed{} answer after </think> matches the label (or one of a list of labels)."""
    if "</think>" in response:
        response = response.rsplit("</think>", 1)[1]
    elif "<think>" in response:
        return 0.0  # reasoning never closed: no final answer
    pred = last_boxed(response)
    if pred is None or label is None or label == "":
        return 0.0
    labels = label if isinstance(label, list | tuple) else [label]
    return 1.0 if any(answers_equal(pred, str(lab)) for lab in labels) else 0.0
