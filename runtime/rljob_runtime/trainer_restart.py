"""In-run trainer restarts (``faultTolerance.maxTrainerRestarts``), the pure part: the budget and the
words. The driver does the restart itself (``driver._restart_trainer``): it tears the trainer group
down, starts it again on the same placement, loads the run's latest checkpoint (model, optimizer,
RNG, data position, the in-flight async rollout), pushes those weights to the engines it kept, and
goes on from the checkpoint's step. Steps after that checkpoint are done again from the same data
position, so no batch is skipped and none reaches the final model twice."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrainerRestart:
    number: int  # 1 for the first restart of this run
    step: int  # the step that was running when the trainer was lost
    resume_step: int  # the step the run goes on from (its checkpoint's, 0 without one)
    lost_ranks: tuple[int, ...]
    cause: str  # one line


class RestartsExhausted(RuntimeError):
    """The run cannot go on: more trainer losses than faultTolerance.maxTrainerRestarts."""


@dataclass
class TrainerRestarts:
    """How many restarts the run may still make, and what each one was."""

    limit: int
    done: list[TrainerRestart] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.done)

    def admit(self, *, step: int, resume_step: int, lost_ranks: list[int], cause: str) -> TrainerRestart:
        """Count one restart, or raise ``RestartsExhausted`` with the reason the job fails with."""
        lost = tuple(sorted(lost_ranks))
        if self.count >= self.limit:
            used = (
                "faultTolerance.maxTrainerRestarts is 0"
                if self.limit == 0
                else f"all {self.limit} restart(s) of faultTolerance.maxTrainerRestarts are used"
            )
            raise RestartsExhausted(f"{lost_phrase(lost)} lost at step {step + 1} and {used}: {cause}")
        restart = TrainerRestart(self.count + 1, step, resume_step, lost, cause)
        self.done.append(restart)
        return restart

    def message(self, restart: TrainerRestart, checkpoint: str | None) -> str:
        """The line printed, put in status and announced by an event."""
        source = f"checkpoint {checkpoint}" if checkpoint else "the initial weights (no checkpoint yet)"
        return (
            f"trainer restart {restart.number} of {self.limit}: {lost_phrase(restart.lost_ranks)} lost "
            f"at step {restart.step + 1} ({restart.cause}); going on from step {restart.resume_step} "
            f"with {source}"
        )


def lost_phrase(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"trainer rank {ranks[0]}"
    return "trainer ranks " + ", ".join(str(r) for r in ranks)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one bounded line (Ray errors carry whole tracebacks)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    first = text.split(" Traceback ")[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."
