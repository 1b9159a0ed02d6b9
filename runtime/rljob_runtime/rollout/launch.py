"""Starting the rollout side: one ``EngineActor`` per engine on its placement bundle, and the router
with every engine registered (``RolloutManager.create``; ``fleet.EngineFleet`` keeps them serving)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from ..models.resolve import resolve_tokenizer
from .engine_actor import EngineActor, actor_options, engine_seed
from .engines import Engine, kill_actor
from .errors import RolloutError
from .router import Router

if TYPE_CHECKING:
    from rljob_api.spec import RLTrainingJobSpec

    from ..placement import Placement

ActorKwargs = Callable[[int], dict[str, Any]]  # engine index -> what its EngineActor is started with


def launch_engines(
    spec: RLTrainingJobSpec,
    model_path: str | Path,
    placement: Placement,
    *,
    log_dir: str | Path | None,
    startup_timeout_s: float,
    weights_path: str | Path | None,
) -> tuple[Router, list[Engine], ActorKwargs]:
    """Start one ``EngineActor`` per engine (``placement.engine_slots()``) and the router, every engine
    registered; nothing is left running when one fails. ``weights_path``: see ``RolloutManager.create``."""
    rollout, resources = spec.rollout, spec.resources
    device = resources.device
    first_slots = [slots[0] for slots in placement.engine_slots()]
    if not first_slots:
        raise RolloutError("the placement has no rollout slots")
    tokenizer_path = str(resolve_tokenizer(spec.model.tokenizer)) if spec.model.tokenizer else None

    def actor_kwargs(index: int) -> dict[str, Any]:
        return dict(
            kind=rollout.engine,
            model_path=str(model_path),
            model_reference=spec.model.path,
            tokenizer_path=tokenizer_path,
            tokenizer_reference=spec.model.tokenizer,
            trust_remote_code=spec.model.trust_remote_code,
            index=index,
            dtype=spec.model.dtype,
            device=device,
            seed=engine_seed(spec.training.seed, index),
            # an engine over k bundles of a node is one process: k bundles' part of its cores
            cpu_share=max(1, first_slots[index].share // placement.gpus_per_engine),
            tp_size=placement.gpus_per_engine,
            enable_memory_saver=placement.colocated and rollout.engine == "sglang",
            sglang_args=dict(rollout.sglang_args),
            return_routed_experts=spec.training.routing_replay,
            log_dir=str(Path(log_dir) / f"engine{index}") if log_dir else None,
            startup_timeout_s=startup_timeout_s,
        )

    actors: list[Any] = [  # Ray actor handles
        EngineActor.options(**actor_options(slot, colocated=placement.colocated, device=device)).remote(
            **actor_kwargs(index)
        )
        for index, slot in enumerate(first_slots)
    ]
    router: Router | None = None
    try:
        start_path = str(weights_path) if weights_path is not None else None
        urls = ray.get([actor.start.remote(start_path) for actor in actors])
        router = Router.start(
            policy=rollout.router.policy, log_dir=Path(log_dir) / "router" if log_dir else None
        )
        for url in urls:
            router.add_worker(url)
    except BaseException:
        if router is not None:
            router.stop()
        for actor in actors:
            kill_actor(actor)
        raise
    engines = [
        Engine(index, slot, actor, url, tp_size=placement.gpus_per_engine)
        for index, (slot, actor, url) in enumerate(zip(first_slots, actors, urls, strict=True))
    ]
    return router, engines, actor_kwargs


def new_actor(spec: RLTrainingJobSpec, slot: Any, kwargs: dict[str, Any]) -> Any:
    """A new ``EngineActor`` on ``slot`` (a relaunch whose actor died); its Ray handle."""
    res = spec.resources
    return EngineActor.options(**actor_options(slot, colocated=res.colocate, device=res.device)).remote(
        **kwargs
    )
