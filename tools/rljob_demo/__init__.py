"""`make demo`: the CPU GRPO demo on the local control plane (see docs/demo.md)."""
