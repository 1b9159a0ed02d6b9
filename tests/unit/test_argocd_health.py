"""The Argo CD health check (gitops/argocd/.../RLTrainingJob/health.lua) on the objects the operator's
own status code produces, run as Argo CD runs it: Lua 5.1 (gopher-lua's dialect), a global `obj`,
a returned table with status and message, and only the libraries argocd-cm scripts get."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import testdata_gen
import yaml

from rljob_api.status import PHASES

lua51 = pytest.importorskip("lupa.lua51", reason="lupa is a dev dependency: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[2]
CUSTOMIZATION = REPO / "gitops" / "argocd" / "resource_customizations" / "rljob.dev" / "RLTrainingJob"
SCRIPT = (CUSTOMIZATION / "health.lua").read_text()
TESTS = yaml.safe_load((CUSTOMIZATION / "health_test.yaml").read_text())["tests"]
ARGO_STATUSES = {"Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing"}

# argocd-cm scripts run with package, base, table and a safe os only (util/lua/lua.go, UseOpenLibs
# false); without the string library strings have no methods either.
_SANDBOX = """
getmetatable("").__index = nil
local safe_os = {time = os.time, clock = os.clock, date = os.date}
string, math, io, debug, coroutine = nil, nil, nil, nil, nil
os = safe_os
"""


def _without_nulls(value: Any) -> Any:
    # Argo's decodeValue turns JSON null into nil: the key is absent in Lua.
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def argo_health(obj: dict[str, Any], script: str = SCRIPT) -> dict[str, str]:
    """ExecuteHealthLua: a fresh Lua state per object, the result table read back through JSON."""
    lua = lua51.LuaRuntime(register_eval=False, register_builtins=False, unpack_returned_tuples=False)
    lua.execute(_SANDBOX)
    lua.globals().obj = lua.table_from(_without_nulls(obj), recursive=True)
    result = lua.execute(script)
    if lua51.lua_type(result) != "table":
        raise TypeError(f"expect table output from Lua script, not {lua51.lua_type(result)}")
    health = json.loads(json.dumps({k: result[k] for k in ("status", "message") if result[k] is not None}))
    if health.get("status") not in ARGO_STATUSES:
        return {"status": "Unknown", "message": "Lua returned an invalid health status"}
    return {"status": health["status"], "message": health.get("message", "")}


def load(input_path: str) -> dict[str, Any]:
    return yaml.safe_load((CUSTOMIZATION / input_path).read_text())


@pytest.mark.parametrize("case", TESTS, ids=[Path(t["inputPath"]).stem for t in TESTS])
def test_health_test_yaml(case: dict[str, Any]) -> None:
    assert argo_health(load(case["inputPath"])) == case["healthStatus"]


def test_every_testdata_object_has_a_case() -> None:
    listed = {t["inputPath"] for t in TESTS}
    found = {f"testdata/{p.name}" for p in (CUSTOMIZATION / "testdata").glob("*.yaml")}
    assert listed == found


def test_every_phase_the_operator_writes_is_covered() -> None:
    phases = {(load(t["inputPath"]).get("status") or {}).get("phase") for t in TESTS}
    assert phases == {None, *PHASES}


def test_unknown_phase_is_progressing() -> None:
    """A phase the script has no branch for (one a later API version adds) must not look healthy."""
    obj = load("testdata/starting.yaml")
    obj["status"]["phase"] = "Exporting"  # made up: no such phase today
    for condition in obj["status"]["conditions"]:
        condition["status"] = "False"
    health = argo_health(obj)
    assert health == {
        "status": "Progressing",
        "message": "Exporting: Ray cluster starting: 0/1 worker pods ready",
    }


def test_failed_wins_over_a_stale_ready_message() -> None:
    obj = load("testdata/failed.yaml")
    obj["status"]["conditions"] = [
        c | {"message": "not this one"} if c["type"] != "Failed" else c for c in obj["status"]["conditions"]
    ]
    assert argo_health(obj)["message"].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_the_runner_reports_script_errors() -> None:
    """A script Argo could not run must fail here too, not pass with some default."""
    with pytest.raises(lua51.LuaError):
        argo_health(
            load("testdata/running.yaml"), SCRIPT.rstrip().removesuffix("return hs") + "return hs.x.y"
        )
    uses_string_lib = SCRIPT.replace('hs.status = "Degraded"', 'hs.status = string.upper("Degraded")', 1)
    with pytest.raises(lua51.LuaError):
        argo_health(load("testdata/failed.yaml"), uses_string_lib)
    assert argo_health({}, 'return {status = "Fine"}') == {
        "status": "Unknown",
        "message": "Lua returned an invalid health status",
    }


def test_committed_testdata_is_what_the_operator_writes_now() -> None:
    for name, obj in testdata_gen.cases().items():
        path = CUSTOMIZATION / "testdata" / f"{name}.yaml"
        assert path.read_text() == testdata_gen.render(copy.deepcopy(obj)), (
            f"{path.name} is stale: run gitops/testdata_gen.py"
        )
