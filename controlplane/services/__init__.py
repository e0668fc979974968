"""Use cases of the control plane: each owns its transaction boundary (callers pass the session)."""
