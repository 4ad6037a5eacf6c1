"""The errors a store raises, named for the user (``storage/store.py`` raises them).

A missing object is not here: it stays a ``FileNotFoundError`` naming the URL, which the
readers turn into a bad sample. Everything else is a :class:`StoreError` (a user error: one
line, exit 2), classified from botocore's error code: a refusal, a timeout, no connection, a
passing failure (retried), or a store that stayed down (the run ends with a checkpoint).
Every message is scrubbed of the environment's credential values (:func:`redact`).
"""

from __future__ import annotations

import os

from cocodet.errors import RunStopped, UserError

# Environment variables whose values must never appear in a message (the standard chain's).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_DENIED_CODES = {
    "AccessDenied",
    "Forbidden",
    "403",
    "401",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "AccountProblem",
    "UnauthorizedAccess",
}


class StoreError(UserError):
    """A store that cannot serve this run at all. Raised in a DataLoader worker, it reaches the
    main process rebuilt from the worker's traceback text (``ExceptionWrapper.reraise``): the
    constructor keeps only this error's own line, so the user still reads one line."""

    def __init__(self, message: str):
        if "Original Traceback" in message:
            message = message.rsplit(f"{type(self).__name__}: ", 1)[-1].strip()
        super().__init__(message)


class StoreAccessError(StoreError):
    """The store refused an operation (401/403, an expired token, an unknown key)."""


class StoreTimeout(StoreError):
    """The store did not answer within ``dataset.remote.timeout_s``."""


class StoreUnreachable(StoreError):
    """No connection to the store at all (a wrong endpoint, a refused connection)."""


class StoreTransient(StoreError):
    """A failure the store says is passing: 5xx, throttling, a reset connection."""


class StoreDown(StoreError, RunStopped):
    """A request failed for ``dataset.remote.give_up_s`` (and at least ``retries`` times): the
    run ends with a resumable checkpoint (``models/preemption.py``) and this one line."""

    status = "store_down"


# Failures worth retrying: the store is busy, restarting or briefly unreachable.
TRANSIENT = (StoreTimeout, StoreUnreachable, StoreTransient)
_TRANSIENT_CODES = {
    "500",
    "502",
    "503",
    "504",
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestLimitExceeded",
    "BadGateway",
}
# A response cut short (the store or a proxy restarted mid-body: aiohttp's ClientPayloadError,
# botocore's IncompleteReadError / ResponseStreamingError): the next attempt reads it whole.
_CUT_SHORT = {
    "ClientPayloadError",
    "ContentLengthError",
    "IncompleteReadError",
    "ResponseStreamingError",
    "ServerDisconnectedError",
}


def redact(text: str) -> str:
    """``text`` with the environment's credential values replaced by ``***``."""
    for name in CREDENTIAL_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _error_code(error: BaseException) -> tuple[str, str]:
    """(code, message) of a store error: botocore's ClientError (kept by s3fs as the cause)."""
    for e in (error, error.__cause__, error.__context__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            err = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(err.get("Code") or status or ""), str(err.get("Message") or "")
    return "", str(error)


def classified(url: str, operation: str, error: Exception, deadline: float, endpoint: str) -> Exception:
    """The StoreError for ``error``, raised by ``operation`` on ``url``."""
    from fsspec.exceptions import FSTimeoutError

    code, message = _error_code(error)
    bucket = bucket_of(url)
    if isinstance(error, PermissionError) or code in _DENIED_CODES or "NoCredentials" in type(error).__name__:
        return StoreAccessError(
            redact(
                f"{url}: the store refused {operation} on bucket {bucket!r} ({code or 'denied'}: {message or error}). "
                "Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), "
                "AWS_PROFILE or the instance's role: check they are set, current and allowed to read this bucket"
            )
        )
    if isinstance(error, (FSTimeoutError, TimeoutError)) or "timeout" in type(error).__name__.lower():
        return StoreTimeout(
            redact(
                f"{url}: the store at {endpoint} did not answer {operation} within dataset.remote.timeout_s="
                f"{deadline:g} s; check the endpoint (dataset.storage_options.endpoint_url or AWS_ENDPOINT_URL) "
                "and the network, or raise dataset.remote.timeout_s"
            )
        )
    if "connect" in type(error).__name__.lower() or "connect" in str(error).lower():
        return StoreUnreachable(
            redact(
                f"{url}: cannot connect to the store at {endpoint} for {operation} ({error}); check "
                "dataset.storage_options.endpoint_url or AWS_ENDPOINT_URL"
            )
        )
    transient = code in _TRANSIENT_CODES or isinstance(error, ConnectionError) or type(error).__name__ in _CUT_SHORT
    kind = StoreTransient if transient else StoreError
    return kind(
        redact(f"{url}: {operation} failed ({type(error).__name__}: {code + ' ' if code else ''}{message or error})")
    )


def bucket_of(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]
