"""The error every model reference that cannot be used raises (the hub's own, ``HubError``, is one).

Below the modules that raise it, so that they and the callers that catch it import it from one
place.
"""


class ModelNotFoundError(FileNotFoundError):
    """A model reference that resolves to no local directory; the message says why."""
