"""Rollout: engines that speak SGLang's HTTP API (real SGLang, or our transformers-backed ``hf``
engine), the request bodies the runtime sends them (``protocol``), and the router in front."""
