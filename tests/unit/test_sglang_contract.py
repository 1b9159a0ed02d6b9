"""Every field the runtime sends to SGLang exists in SGLang's own source.

The `sglang` wheel is installed with `pip install --no-deps sglang` (CI does this) and never
imported: its files are located with `importlib.util.find_spec` (which runs no package code) and
parsed with `ast`. The request bodies and launch flags come from `rljob_runtime.engine_api`,
the one place the runtime builds them.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

import pytest

from rljob_runtime import engine_api
from rljob_runtime.sync.nccl import BucketSpec

INSTALL_HINT = (
    "the SGLang contract test needs the pinned sglang wheel's source (never imported): "
    "make venv (it installs pyproject.toml's gpu-extra pin without dependencies)"
)


@cache
def sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(INSTALL_HINT)
    return Path(next(iter(spec.submodule_search_locations)))


def _parse(relative: str) -> ast.Module:
    path = sglang_root() / relative
    if not path.is_file():
        pytest.fail(f"{path} is missing: is this an SGLang wheel? {INSTALL_HINT}")
    return ast.parse(path.read_text(), filename=str(path))


def _classes(module: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.walk(module) if isinstance(node, ast.ClassDef)}


def _own_fields(cls: ast.ClassDef) -> set[str]:
    return {
        stmt.target.id
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and not stmt.target.id.startswith("_")
    }


def _fields(classes: dict[str, ast.ClassDef], name: str) -> set[str]:
    """Annotated fields of a dataclass / msgspec Struct, with those of its bases in the same module."""
    cls = classes[name]
    fields = _own_fields(cls)
    for base in cls.bases:
        base_name = ast.unparse(base).split(".")[-1]
        if base_name in classes:
            fields |= _fields(classes, base_name)
    return fields


@cache
def io_struct_classes() -> dict[str, ast.ClassDef]:
    return _classes(_parse("srt/managers/io_struct.py"))


@cache
def server_args_fields() -> set[str]:
    """ServerArgs fields: declared in the class (SGLang <= 0.5.x) or in the namespaces under
    ``srt/arg_groups/fields/`` (newer), plus flags registered by hand with ``add_argument``."""
    module = _parse("srt/server_args.py")
    fields = _fields(_classes(module), "ServerArgs")
    namespace_dir = sglang_root() / "srt" / "arg_groups" / "fields"
    for path in sorted(namespace_dir.glob("*.py")) if namespace_dir.is_dir() else []:
        for cls in _classes(ast.parse(path.read_text(), filename=str(path))).values():
            fields |= _own_fields(cls)
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("--")
                ):
                    fields.add(arg.value[2:].replace("-", "_"))
    return fields


@pytest.mark.parametrize("path", sorted(engine_api.REQUEST_BODIES))
def test_request_fields_exist_in_sglang(path: str) -> None:
    class_name, sent = engine_api.REQUEST_BODIES[path]
    classes = io_struct_classes()
    assert class_name in classes, f"{path}: SGLang has no class {class_name} in io_struct.py"
    missing = sent - _fields(classes, class_name)
    assert not missing, f"{path}: fields {sorted(missing)} are not in SGLang's {class_name}"


def test_sampling_params_exist_in_sglang() -> None:
    classes = _classes(_parse("srt/sampling/sampling_params.py"))
    known = _fields(classes, "SamplingParams")
    init = next(
        (
            f
            for f in classes["SamplingParams"].body
            if isinstance(f, ast.FunctionDef) and f.name == "__init__"
        ),
        None,
    )
    if init is not None:  # older SGLang: a plain class whose __init__ takes the parameters
        known |= {a.arg for a in init.args.args + init.args.kwonlyargs}
    missing = engine_api.SAMPLING_PARAM_FIELDS - known
    assert not missing, f"sampling_params {sorted(missing)} are not SGLang SamplingParams fields"


def test_launch_flags_are_server_args() -> None:
    known = server_args_fields()
    missing = {flag for flag in engine_api.LAUNCH_FLAGS if flag.replace("-", "_") not in known}
    assert not missing, f"launch flags {sorted(missing)} are not SGLang ServerArgs fields"


def test_builders_send_only_declared_fields() -> None:
    """The field lists above are the truth only if the body builders stay inside them."""
    bodies = {
        "/generate": [
            engine_api.generate_body(
                input_ids=[1, 2], params=engine_api.sampling_params(stop=["x"]), rid="r"
            ),
            engine_api.generate_body(text="hi"),
        ],
        "/abort_request": [engine_api.abort_body(), engine_api.abort_body(rid="r")],
        "/pause_generation": [engine_api.pause_body(), engine_api.pause_body("retract")],
        "/continue_generation": [{}],
        "/update_weights_from_disk": [
            engine_api.update_weights_from_disk_body("/m", weight_version="2", load_format="auto")
        ],
        "/update_weights_from_tensor": [
            engine_api.update_weights_from_tensor_body(
                ["x"], load_format="flattened_bucket", weight_version="3"
            )
        ],
        "/init_weights_update_group": [
            engine_api.init_weights_update_group_body(
                master_address="h", master_port=1, rank_offset=1, world_size=2, group_name="g"
            )
        ],
        "/update_weights_from_distributed": [
            engine_api.update_weights_from_distributed_body(
                names=["a"], dtypes=["bfloat16"], shapes=[[2, 2]], group_name="g", weight_version="4"
            ),
            engine_api.update_weights_from_distributed_body(
                names=["a"], dtypes=["bfloat16"], shapes=[[2]], group_name="g", load_format="flattened_bucket"
            ),
            BucketSpec(("a",), ("bfloat16",), ((2, 2),)).body("g", "5"),
        ],
        "/destroy_weights_update_group": [engine_api.destroy_weights_update_group_body("g")],
        "/update_weight_version": [engine_api.update_weight_version_body("6")],
        "/release_memory_occupation": [
            engine_api.memory_occupation_body(),
            engine_api.memory_occupation_body(["weights"]),
        ],
        "/resume_memory_occupation": [engine_api.memory_occupation_body(["kv_cache", "cuda_graph"])],
    }
    assert set(bodies) == set(engine_api.REQUEST_BODIES)
    for path, examples in bodies.items():
        for body in examples:
            extra = set(body) - engine_api.REQUEST_BODIES[path][1]
            assert not extra, f"{path} builder sends undeclared fields {sorted(extra)}"
            if "sampling_params" in body:
                assert set(body["sampling_params"]) <= engine_api.SAMPLING_PARAM_FIELDS
    args = engine_api.sglang_launch_args(
        model_path="/m",
        tokenizer_path="/t",
        trust_remote_code=True,
        host="127.0.0.1",
        port=30000,
        tp_size=2,
        base_gpu_id=2,
        enable_memory_saver=True,
        mem_fraction_static=0.7,
        random_seed=1,
    )
    flags = {arg[2:] for arg in args if arg.startswith("--")}
    assert flags <= engine_api.LAUNCH_FLAGS
    assert (
        args[:2] == ["--model-path", "/m"]
        and "--enable-memory-saver" in args
        and "--skip-server-warmup" in args
    )


def test_the_source_checked_is_the_pinned_release() -> None:
    """The contract holds for the SGLang the runtime pins (pyproject.toml's gpu extra), not another."""
    import importlib.metadata

    from rljob_runtime.sglang_install import pinned_sglang_version

    assert importlib.metadata.version("sglang") == pinned_sglang_version(), INSTALL_HINT
    versions = [  # _version.py: __version__ = version = '0.5.16'
        node.value.value
        for node in _parse("_version.py").body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
    ]
    assert versions == [pinned_sglang_version()]


def test_the_flags_the_api_refuses_are_sglangs() -> None:
    """Every flag ``rollout.sglangArgs`` may not set (the runtime sets it) is a flag of the pinned
    SGLang: a ServerArgs field, or an alias SGLang registers (e.g. --tensor-parallel-size)."""
    from rljob_api.sglang_flags import RUNTIME_OWNED_SGLANG_FLAGS

    source = (sglang_root() / "srt" / "server_args.py").read_text()
    known = server_args_fields()
    missing = [
        f for f in RUNTIME_OWNED_SGLANG_FLAGS if f.replace("-", "_") not in known and f'"--{f}"' not in source
    ]
    assert not missing, f"not SGLang flags: {missing}"
    assert "not_a_flag" not in known and '"--not-a-flag"' not in source  # the check can fail


def test_contract_catches_a_wrong_field() -> None:
    """The check is not vacuous: a made-up field is reported missing."""
    assert "not_a_field" not in _fields(io_struct_classes(), "GenerateReqInput")
    assert "rid" in _fields(io_struct_classes(), "AbortReq")  # inherited from BaseReq
    assert "not_a_flag" not in server_args_fields()


def _internal_state_keys() -> set[str]:
    """String keys ``Scheduler.get_internal_state`` sets on its answer (``ret["..."] = ...``): one
    entry of ``/server_info``'s ``internal_states`` per data-parallel scheduler."""
    module = _parse("srt/managers/scheduler.py")
    methods = [
        node
        for node in ast.walk(module)
        if isinstance(node, ast.FunctionDef) and node.name == "get_internal_state"
    ]
    assert methods, "Scheduler.get_internal_state is gone from the pinned SGLang"
    return {
        target.slice.value
        for method in methods
        for node in ast.walk(method)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Subscript)
        and isinstance(target.slice, ast.Constant)
        and isinstance(target.slice.value, str)
    }


def test_the_running_capacity_the_client_reads_is_in_sglangs_server_info() -> None:
    """``engine_api.running_capacity`` reads this key of each ``internal_states`` entry; without it
    the rollout client falls back to a fixed number of requests in flight per engine."""
    keys = _internal_state_keys()
    assert engine_api.RUNNING_CAPACITY_KEY in keys, sorted(keys)
    assert "not_a_key" not in keys and "memory_usage" in keys  # the check can fail, and reads the method
