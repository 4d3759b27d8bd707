"""The simulated engine: no model, the same seam (see :mod:`.engine`)."""
