"""Weights as named CPU tensors over HTTP (``/update_weights_from_tensor``), for the ``hf`` engine on
machines that share no disk with it: rljob's CPU wire format (``engine_api.py``), the whole
model in one request. Nothing is kept between syncs: a relaunched engine gets a fresh export."""

from __future__ import annotations

from .. import engine_api
from .base import EngineUpdateLike, Metrics, NamedWeights, RolloutSide, WeightTransport, nbytes, timed


class TensorTransport(WeightTransport):
    name = "tensors"

    def _transfer(self, trainer: NamedWeights, rollout: RolloutSide, update: EngineUpdateLike) -> Metrics:
        metrics: Metrics = {}
        with timed(metrics, "time/sync_export"):
            named = trainer.named_tensors()
            data = engine_api.serialize_named_tensors(named.items())
        update.post("/update_weights_from_tensor", engine_api.update_weights_from_tensor_body([data]))
        metrics["sync/bytes"] = float(nbytes(named))
        return metrics
