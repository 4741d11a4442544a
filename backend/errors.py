"""The root of the errors the user can act on, and how everything else is reported.

`UserError`: what was asked cannot be done as asked, and the message says why and what to do (one sentence, no
traceback, no server path). A bad parameter, task or file, an unknown model, an architecture the adapter table
lacks, a disk that cannot take a file, a request the service refuses: `BadInput` (also a ValueError), TaskError,
ModelLoadError, UnsupportedArchitecture, WriteError, ServiceError and the others derive from it. The job runner
(`service.jobs.describe_error`) and the command line show its message as it is.

Anything else that escapes an analysis (a bare ValueError, KeyError or IndexError inside the math) is a fault of
the product, not of the request: it is reported as `internal(e)`, "internal error (ValueError): ...", and its
traceback goes to the log.
"""
from __future__ import annotations


class UserError(Exception):
    """A request that cannot be done as asked; its message tells the user why and what to change."""


class BadInput(UserError, ValueError):
    """A value the user gave that cannot be used: a parameter out of this model's range, a setting, a file's content.
    A ValueError too, so an `except ValueError` written before it existed still catches it."""


def internal(e: BaseException) -> str:
    """The one line that reports a fault of the product: `internal error (KeyError): 'x'`."""
    text = str(e).splitlines()[0][:500] if str(e) else ""
    return f"internal error ({type(e).__name__})" + (f": {text}" if text else "")
