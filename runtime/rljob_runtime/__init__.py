"""The rljob runtime: the RL training driver that runs inside the RayJob (or locally)."""
