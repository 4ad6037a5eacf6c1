"""The error every layer raises for a mistake the user can fix (bottom layer: imports nothing).

``cli`` prints a :class:`UserError` as one line on stderr and exits 2; anything else keeps its
traceback. :class:`BadSampleError` is the one error that is not the user's: an image or
annotation that cannot be used, which ``dataset.on_bad_sample`` decides about.
"""

# Every value of a training summary's ``status``: how the run ended. ``completed``,
# ``preempted`` (SIGTERM) and ``interrupted`` (Ctrl-C) come from ``modes/train.py``; the others
# are the ``status`` of the RunStopped that ended the run (``store_down`` is storage's
# StoreDown). README "Watching a run" and design §2 list them; tests/test_readme.py checks both
# lists and every status set in src/.
RUN_STATUSES = (
    "completed",
    "preempted",
    "interrupted",
    "store_down",
    "disk_full",
    "diverged",
    "collapsed",
    "nonfinite",
)


class UserError(Exception):
    """A mistake the user can fix (a value, an option, a path); printed as one line, exit 2."""


class ConfigError(UserError, ValueError):
    """A config value outside what its key allows."""


class RunStopped(UserError):
    """A run that ended early for a reason the user can act on. ``summary``: the run's summary
    as far as it got, printed on stdout (and written) before the one error line; ``status``:
    the summary's status."""

    status = "stopped"

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


class DiskFull(RunStopped):
    """A write ran out of space; what was there before is intact."""

    status = "disk_full"


class TrainingStopped(RunStopped):
    """The health checks ended training (design §12). ``status``: "diverged" (non-finite
    losses) or "collapsed" (``model.health.on_collapse=stop``)."""

    def __init__(self, message: str, status: str, summary: dict | None = None):
        super().__init__(message, summary)
        self.status = status


class UnusableModel(RunStopped):
    """Training ran to its end, but the model it ended with is not finite, or its last
    checkpoint could not be written for that reason: not ``completed`` (design §12)."""

    status = "nonfinite"


class BadSampleError(RuntimeError):
    """A sample that cannot be used; carries what a user needs to find it."""

    def __init__(self, path: str, image_id: int | None = None, reason: str | None = None):
        # One-argument form: DataLoader re-raises worker errors as exc_type(message).
        message = path if image_id is None else f"bad sample: image_id={image_id} file={path}: {reason}"
        super().__init__(message)
        self.path, self.image_id, self.reason = path, image_id, reason

    def __reduce__(self):  # keep the fields when the error crosses a worker boundary
        return (BadSampleError, (self.path, self.image_id, self.reason))
