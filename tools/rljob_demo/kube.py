"""kubectl against the local control plane: the demo shows what a user would type and see."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class KubectlError(RuntimeError):
    pass


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [str(self.binary), *args], input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json"))

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        out = self.run("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None
