"""docs/follow-a-run.md names every phase, condition type and reason the code can set or post.

The reasons are read from the source, where they are written: the reason argument of the calls that
make one (Verdict, Blocker, Decision, Trouble, Stuck, a Failure's `made`, an event's `emit` / `_event`),
the (type, reason, message) tuples of events, the names a `reason` variable is given, and the module
constants those refer to. The reasons of False conditions come from `status.conditions` itself. A
reason added to the code and not to the doc fails here, and so does a reason the doc lists that the
code no longer has (KubeRay's own reasons, which the operator passes on, are listed below).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from operator_fixtures import NOW, job_from_spec

from rljob_api.status import CONDITION_TYPES, PHASES
from rljob_operator import status
from rljob_operator.pod_states import REASONS as STUCK_REASONS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "follow-a-run.md"
SOURCES = (
    *sorted((ROOT / "operator" / "rljob_operator").glob("*.py")),
    ROOT / "runtime" / "rljob_runtime" / "report.py",
)

# The position of the reason among the positional arguments of each call that makes one.
REASON_ARGUMENT = {
    "Verdict": 1,  # status.py: (phase, reason, message)
    "Blocker": 0,  # checks.py
    "Decision": 1,  # quota.py: (admitted, reason, message)
    "Trouble": 0,  # api_errors.py
    "Stuck": 0,  # pod_states.py
    "made": 0,  # restarts.py: a Failure
    "emit": 2,  # reconcile.py: (obj, type, reason, message)
    "_emit": 2,  # handlers.py
    "_event": 1,  # the runtime's report.py: (type, reason, message)
    "_condition_entry": 3,  # status.py: (job, kind, true, reason, message, now)
}
EVENT_TYPES = ("Normal", "Warning")
# KubeRay's JobFailedReason values (ray.io/v1 RayJob status.reason, v1.6): the operator copies them
# into the Failed condition and status.restartHistory.
KUBERAY_REASONS = {
    "AppFailed",
    "SubmissionFailed",
    "DeadlineExceeded",
    "PreRunningDeadlineExceeded",
    "JobDeploymentStatusTransitionGracePeriodExceeded",
    "ValidationFailed",
}


class Module:
    """One source file: its module-level string constants and what it imports by name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.constants: dict[str, str] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module stem, name there)
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name, value in _pairs(target, node.value):
                        if isinstance(value, ast.Constant) and isinstance(value.value, str):
                            self.constants[name] = value.value
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)


def _pairs(target: ast.expr, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """(name, value) for `a = v` and for `a, b = v, w`."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif (
        isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts)
    ):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from _pairs(t, v)


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def code_reasons() -> set[str]:
    modules = {path.stem: Module(path) for path in SOURCES}

    def constant(module: Module, name: str) -> str | None:
        if name in module.constants:
            return module.constants[name]
        source, original = module.imports.get(name, ("", ""))
        return modules[source].constants.get(original) if source in modules else None

    def strings(module: Module, node: ast.expr, *, literals: bool = True) -> Iterator[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and literals:
            yield node.value
        elif isinstance(node, ast.Name) and (value := constant(module, node.id)) is not None:
            yield value
        elif isinstance(node, ast.BoolOp):  # `kuberay_reason or "RayJobStopped"`
            for operand in node.values:
                yield from strings(module, operand, literals=literals)

    found: set[str] = set()
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Call) and _called(node) in REASON_ARGUMENT:
                index = REASON_ARGUMENT[_called(node)]
                if index < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[:index]):
                    found.update(strings(module, node.args[index]))
            elif isinstance(node, ast.Tuple) and len(node.elts) == 3:  # an event: (type, reason, message)
                kind = node.elts[0]
                if isinstance(kind, ast.Constant) and kind.value in EVENT_TYPES:
                    found.update(strings(module, node.elts[1]))
            elif isinstance(node, ast.Assign):  # `reason, line = EXHAUSTED, ...`: constants only
                for target in node.targets:
                    for name, value in _pairs(target, node.value):
                        if name == "reason":
                            found.update(strings(module, value, literals=False))
    return found | set(STUCK_REASONS) | false_condition_reasons()


def false_condition_reasons() -> set[str]:
    """Every reason `status.conditions` gives a condition other than Ready's verdict, in every phase."""
    job = job_from_spec()
    found = set()
    for phase in PHASES:
        for stalled in (False, True):
            verdict = status.Verdict(phase, "TheVerdictsReason", "message", stalled=stalled)
            for condition in status.conditions(job, verdict, NOW):
                found.add(condition["reason"])
    return found - {"TheVerdictsReason"}


def _section(title: str) -> str:
    text = DOC.read_text()
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert found, f"docs/follow-a-run.md lost its section '## {title}'"
    return found.group(1)


def _first_column(section: str) -> set[str]:
    """The backquoted names in the first cell of each table row."""
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Za-z]+)`", line.split("|")[1]))
    return names


def test_the_collector_finds_the_reasons_it_is_meant_to() -> None:
    found = code_reasons()
    assert {"InsufficientQuota", "BackoffLimitExceeded", "WaitingForKueue", "TrainerRestarted"} <= found
    assert {
        "Created",
        "InvalidSpec",
        "ConversionStarted",
        "RayJobStopped",
        "NotStalled",
        "Reconciled",
    } <= found
    assert not {"Normal", "Warning", "RayJob", "MegatronCheckpoint", "ReplicaFailure"} & found


def test_every_condition_type_is_documented() -> None:
    assert _first_column(_section("Conditions")) == set(CONDITION_TYPES)


def test_every_phase_is_documented() -> None:
    assert _first_column(_section("Phases")) == set(PHASES)


def test_every_reason_in_the_code_is_documented() -> None:
    missing = code_reasons() - _first_column(_section("Reasons and events"))
    assert not missing, (
        f"reasons the code sets or posts that docs/follow-a-run.md does not list: {sorted(missing)}"
    )


def test_every_documented_reason_is_in_the_code_or_kuberays() -> None:
    stale = _first_column(_section("Reasons and events")) - code_reasons() - KUBERAY_REASONS
    assert not stale, f"reasons docs/follow-a-run.md lists that nothing sets: {sorted(stale)}"
