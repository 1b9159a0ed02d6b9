"""Which failures are the job's own configuration: a restart would meet them again, so `train`
exits EXIT_NOT_RETRIABLE for them whenever they happen (loading the config, in `prepare`, or once
the run is going), and the operator fails the job instead of restarting it.

A configuration error is one of the kinds below, raised directly, as the cause of another error
(`raise ... from`), or inside a Ray task or actor (Ray's RayTaskError keeps it as `cause` and is an
instance of its class). An error merely raised while another was handled (__context__) is not
followed: code that catches a missing local model and then fails to download it is not
refusing the job."""

from __future__ import annotations


def _config_kinds() -> tuple[type[BaseException], ...]:
    # Imported here: the trainer and data modules import this package's heavier floors.
    from rljob_api.errors import SpecError

    from .data.prompts import DataError
    from .trainer.megatron.arch import UnsupportedModelError

    # SpecError: the spec breaks the API's rules (ConfigError is one); DataError: prompt data that
    # cannot be trained on; UnsupportedModelError: a model the megatron backend cannot build.
    return (SpecError, DataError, UnsupportedModelError)


def _local_model_missing(exc: BaseException) -> bool:
    """A local model path that does not hold a model; not a hub download (HubError), which may
    work a minute later."""
    from .models.errors import ModelNotFoundError
    from .models.hub_rules import HubError

    return isinstance(exc, ModelNotFoundError) and not isinstance(exc, HubError)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, what caused it (Python's __cause__, Ray's `cause`), and so on."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        ray_cause = getattr(item, "cause", None)
        todo += [item.__cause__, ray_cause if isinstance(ray_cause, BaseException) else None]
    return seen


def is_config_error(exc: BaseException) -> bool:
    """Whether `exc` (or anything in its chain) is a configuration error."""
    kinds = _config_kinds()
    return any(isinstance(e, kinds) or _local_model_missing(e) for e in _chain(exc))
