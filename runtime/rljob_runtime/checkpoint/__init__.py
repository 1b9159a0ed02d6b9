"""Checkpoints of a run: trainer state (model, optimizer, RNG) plus the driver's own state."""
