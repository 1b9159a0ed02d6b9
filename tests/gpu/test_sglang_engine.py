"""Stock SGLang as the runtime launches it (``EngineProcess``, no Ray): the runtime's flags and the
job's ``sglangArgs`` reach the server, memory release frees the GPU and resume brings it back,
weights load from disk, and a server that exits or never gets healthy fails with its log's end."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_case import KIT_ARGS, greedy, http, results_file, smollm2

from rljob_runtime.rollout.engine_actor import EngineProcess, EngineStartError


def test_flags_reach_the_server_and_memory_is_released_and_resumed(tmp_path: Path) -> None:
    model = smollm2()
    engine = EngineProcess(
        kind="sglang",
        model_path=model,
        device="cuda",
        dtype="bfloat16",
        seed=5,
        tp_size=1,
        enable_memory_saver=True,
        sglang_args={**KIT_ARGS, "context-length": "1024", "mem-fraction-static": "0.4"},
        log_dir=str(tmp_path),
        startup_timeout_s=600,
    )
    try:
        url = engine.start()
        info = http("GET", f"{url}/server_info")
        keys = ("tp_size", "base_gpu_id", "context_length", "enable_memory_saver", "random_seed")
        print(
            "server_info:",
            {k: info.get(k) for k in (*keys, "attention_backend", "dtype", "skip_server_warmup")},
        )
        assert (info["tp_size"], info["base_gpu_id"], info["context_length"]) == (1, 0, 1024)
        assert info["enable_memory_saver"] is True and info["random_seed"] == 5
        assert info["attention_backend"] == "triton" and info["skip_server_warmup"] is True
        assert info["dtype"] == "bfloat16" and info["model_path"] == model
        assert http("GET", f"{url}/model_info")["weight_version"] == "default"
        before = greedy(url)
        resident = engine.gpu_memory_gb()
        http("POST", f"{url}/release_memory_occupation", {})
        released = engine.gpu_memory_gb()
        http("POST", f"{url}/resume_memory_occupation", {"tags": ["weights"]})
        # released without a CPU copy: the weights must be written again (what a sync does)
        answer = http("POST", f"{url}/update_weights_from_disk", {"model_path": model})
        assert answer["success"], answer
        http("POST", f"{url}/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
        http("POST", f"{url}/update_weight_version", {"new_version": "1", "abort_all_requests": False})
        after = greedy(url)
        resumed = engine.gpu_memory_gb()
        print(
            f"engine GPU memory: resident {resident:.2f} GB, released {released:.2f} GB, resumed {resumed:.2f} GB"
        )
        results_file(
            "sglang-engine-memory", {"resident_gb": resident, "released_gb": released, "resumed_gb": resumed}
        )
        assert 0 < released < 0.25 * resident, (resident, released)
        assert resumed > 0.8 * resident
        assert after == before, "the same weights after release, reload and resume"
        assert http("GET", f"{url}/model_info")["weight_version"] == "1"
    finally:
        engine.shutdown()


def test_a_server_that_exits_or_never_gets_healthy_fails_with_its_log(tmp_path: Path) -> None:
    model = smollm2()
    bad = EngineProcess(
        kind="sglang",
        model_path=model,
        device="cuda",
        sglang_args={**KIT_ARGS, "context-length": "many"},
        log_dir=str(tmp_path / "bad"),
    )
    with pytest.raises(EngineStartError) as exited:
        bad.start()
    bad.shutdown()
    message = " ".join(str(exited.value).split())
    assert "exited with code" in message and "context-length" in message and len(message) < 1000, message
    slow = EngineProcess(
        kind="sglang",
        model_path=model,
        device="cuda",
        sglang_args=KIT_ARGS,
        log_dir=str(tmp_path / "slow"),
        startup_timeout_s=3,
    )
    with pytest.raises(EngineStartError, match="was not healthy after 3 s"):
        slow.start()
    slow.shutdown()
    print("start failures:", message[:300])
