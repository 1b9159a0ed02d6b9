"""Rollout: engines that speak SGLang's HTTP API (real SGLang, or our transformers-backed ``hf``
engine) and the router in front; the request bodies sent to them are ``rljob_runtime.engine_api``."""
