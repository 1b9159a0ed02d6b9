"""Text rewards: whitespace-normalised exact match, and SQuAD's token F1."""

from __future__ import annotations

import re
import string
from collections import Counter


def _labels(label: object) -> list[str]:
    return [str(x) for x in label] if isinstance(label, list | tuple) else [str(label)]


def exact_match_reward(response: str, label: object) -> float:
    """1.0 when the response equals the label (or any of a list) after stripping and collapsing whitespace."""
    if label is None:
        return 0.0
    pred = " ".join(response.split())
    return 1.0 if any(pred == " ".join(lab.split()) for lab in _labels(label)) else 0.0


def squad_normalize(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, truth: str) -> float:
    """Harmonic mean of token precision and recall after SQuAD normalisation."""
    pred, gold = squad_normalize(prediction).split(), squad_normalize(truth).split()
    if not pred or not gold:
        return float(pred == gold)  # both empty counts as a match, as in SQuAD
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_reward(response: str, label: object) -> float:
    """Best token F1 of the response against the label (or any of a list of labels)."""
    if label is None:
        return 0.0
    return max(token_f1(response, lab) for lab in _labels(label))
