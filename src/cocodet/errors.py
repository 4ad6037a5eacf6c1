"""The error every layer raises for a mistake the user can fix (bottom layer: imports nothing).

``cli`` prints a :class:`UserError` as one line on stderr and exits 2; anything else keeps its
traceback.
"""


class UserError(Exception):
    """A mistake the user can fix (a value, an option, a path); printed as one line, exit 2."""


class ConfigError(UserError, ValueError):
    """A config value outside what its key allows."""


class DiskFull(UserError):
    """A write ran out of space; what was there before is intact. ``summary``: the run's summary
    as far as it got, printed on stdout before the one error line."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary
