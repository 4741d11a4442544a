"""Errors the service answers with a 4xx status and a one-line message (`{"detail": message}`), and the
command line's UsageError (one line on stderr, exit status 2); both are user errors (`backend/errors.py`)."""
from __future__ import annotations

from ..errors import BadInput, UserError
from ..text import clip  # noqa: F401  (re-exported: service modules echo input through it)


class ServiceError(UserError):
    """A request the service refuses; `status` is the HTTP status, the message says why and what to do."""

    status: int = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class UsageError(BadInput):
    """A command line that cannot run (`python -m backend ...`, the sweep command too): printed as one line by
    `backend.cli.main`, exit status 2. Defined here, below both backend.cli and backend.service.sweep_cli."""


class BadRequest(ServiceError):
    status = 422


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class TooLarge(ServiceError):
    status = 413


class Busy(ServiceError):
    status = 429




class InsufficientStorage(ServiceError):
    """The service cannot write what the job would make (trained tensors): a full or read-only disk."""

    status = 507
