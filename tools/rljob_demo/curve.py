"""The reward curve of a finished run: read from the runtime's TensorBoard logs, drawn as a PNG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

Series = list[tuple[int, float]]

TRAIN_REWARD = "reward/mean"
EVAL_PREFIX = "eval/"


def read_scalars(logdir: Path) -> dict[str, Series]:
    """Every scalar tag under ``logdir`` as (step, value) pairs sorted by step, the last write of a
    step winning (a resumed run rewrites the steps after its checkpoint)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict[str, Series] = {}
    for tag in acc.Tags().get("scalars", []):
        by_step = {event.step: float(event.value) for event in acc.Scalars(tag)}
        out[tag] = sorted(by_step.items())
    return out


def eval_tags(scalars: dict[str, Series]) -> list[str]:
    """``eval/<dataset>/reward`` tags, one per evaluation dataset."""
    return sorted(t for t in scalars if t.startswith(EVAL_PREFIX) and t.endswith("/reward"))


@dataclass(frozen=True)
class Summary:
    steps: int
    first: float  # mean training reward of the first step
    last: float  # of the last step
    evals: dict[str, tuple[tuple[int, float], tuple[int, float]]]  # dataset -> first, last (step, reward)

    def line(self) -> str:
        text = f"reward {self.first:.2f} (step 1) -> {self.last:.2f} (step {self.steps})"
        for name, ((first_step, first), (last_step, last)) in self.evals.items():
            text += f"; eval {name} {first:.2f} ({_when(first_step)}) -> {last:.2f} ({_when(last_step)})"
        return text


def _when(step: int) -> str:
    return "before training" if step == 0 else f"step {step}"


def summarize(scalars: dict[str, Series]) -> Summary | None:
    rewards = scalars.get(TRAIN_REWARD) or []
    if not rewards:
        return None
    evals = {}
    for tag in eval_tags(scalars):
        points = scalars[tag]
        evals[tag[len(EVAL_PREFIX) : -len("/reward")]] = (points[0], points[-1])
    return Summary(steps=rewards[-1][0], first=rewards[0][1], last=rewards[-1][1], evals=evals)


def plot_rewards(scalars: dict[str, Series], out: Path, title: str) -> Path:
    """Training reward per step (and each evaluation dataset's reward) as a PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    try:
        train = scalars.get(TRAIN_REWARD) or []
        ax.plot([s for s, _ in train], [v for _, v in train], marker="o", label="training reward (mean)")
        for tag in eval_tags(scalars):
            points = scalars[tag]
            name = tag[len(EVAL_PREFIX) : -len("/reward")]
            ax.plot(
                [s for s, _ in points],
                [v for _, v in points],
                marker="s",
                linestyle="--",
                label=f"eval: {name}",
            )
        ax.set_xlabel("rollout step")
        ax.set_ylabel("reward")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(title)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out
