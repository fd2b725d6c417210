"""What the service raises besides core's InputError: the server cannot take this now (Unavailable:
503, or 429 for one client's share) or the thing asked for does not exist (NotFound: 404).
app/http/errors.py turns each into its status; nothing here knows HTTP beyond those numbers."""

from __future__ import annotations


class Unavailable(Exception):
    """The server cannot take this now (busy, or a feature that is off): 503, or 429 for one client's
    share; with Retry-After when trying again later will help."""

    def __init__(self, message: str, retry_after_s: int | None, status_code: int = 503):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status_code = status_code


class NotFound(Exception):
    """No such thing (a training run's id): 404."""


class Forbidden(Exception):
    """Not yours to do: 401 when no credential was given, 403 when it is not the right one (a class's
    teacher token)."""

    def __init__(self, message: str, status_code: int = 403):
        super().__init__(message)
        self.status_code = status_code
