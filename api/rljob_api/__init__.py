"""The RLTrainingJob API: pydantic models shared by the operator and the runtime (pydantic + pyyaml only)."""
