"""Error types every layer shares: what a caller did wrong, said once, in one place."""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine refuses; ``field`` names the offending argument."""

    def __init__(self, message: str, field: str = "", code: str = "invalid_argument"):
        super().__init__(message)
        self.field = field
        self.code = code
