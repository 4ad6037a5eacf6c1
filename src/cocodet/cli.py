"""The command-line contract of train.py: user errors end in one stderr line and exit status 2.

Hydra prints its own errors over several lines and exits 1; errors raised inside a job are
printed with a banner. Users (and scripts) need one line that names the key, value or path,
and a status that tells a mistake from a crash. Unexpected errors keep their traceback.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys

from omegaconf import DictConfig

from cocodet.app import run
from cocodet.credentials import refused_override
from cocodet.loader.failures.hang import stacks_dir

log = logging.getLogger(__name__)


def main(hydra_main) -> None:
    """Run the ``@hydra.main`` entry so that Hydra's own user errors (an unknown option or key,
    an unparsable override) end like ours: one stderr line, exit status 2 (see :func:`task`)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for argument in sys.argv[1:]:  # before Hydra writes them to .hydra/overrides.yaml (cocodet/credentials.py)
        reason = refused_override(argument)
        if reason:
            sys.stderr.write(f"error: {reason}\n")
            sys.exit(2)
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra re-raises instead of printing and exiting 1
    atexit.register(shutil.rmtree, stacks_dir(), True)  # the workers' stack-dump files (loader/failures/hang.py)
    from cocodet.errors import UserError

    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException, UserError) as e:  # UserError: a grid sweep's failed job
        _exit_user_error(e)


def task(cfg: DictConfig) -> float | None:
    """The job: :func:`run`, and the figure it hands Hydra (``search/objective.py``). User
    errors (a bad value, a missing path, malformed annotations) end a single run in one line and
    exit status 2; inside a multirun they are raised, so that Hydra records the job as failed and
    the sweep goes on. Unexpected errors keep their traceback."""
    from hydra.errors import InstantiationException

    from cocodet.errors import UserError

    try:
        summary = run(cfg)
    except UserError as e:
        _user_error(e)
    except InstantiationException as e:
        if isinstance(e.__cause__, UserError):  # raised inside a constructor built from config
            _user_error(e.__cause__)
        raise
    if summary.get("status") == "interrupted":  # Ctrl-C: the summary is written; a shell's 128 + SIGINT
        sys.exit(130)
    return _figure(summary, cfg)


def _figure(summary: dict, cfg: DictConfig) -> float | None:
    from cocodet.search.objective import TrialFailed, figure

    try:
        return figure(summary, str(cfg.mode), cfg.get("optimized_metric"))
    except TrialFailed as e:
        if _in_multirun():
            _user_error(e)
        if summary.get("status", "completed") == "completed":  # a single run that completed keeps its status
            log.warning("%s", e)
        return None


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _user_error(error: BaseException) -> None:
    """A single run: one line, exit 2. A multirun's job: the error line in the job's log, then
    raised for Hydra to record (a sweeper reads it as the trial's failure)."""
    if not _in_multirun():
        _exit_user_error(error)
    log.error("error: %s", _one_line(error))
    raise error


def _exit_user_error(error: BaseException) -> None:
    sys.stderr.write(f"error: {_as_rule(error) or _one_line(error)}\n")
    sys.exit(2)


def _as_rule(error: BaseException) -> str | None:
    """What a group's schema refused at composition, in cocodet's words: a value as its rule in
    ``schema.py`` words it (``loader.batch_size='abc' ... expected an integer >= 1``), a key the
    group does not declare with the closest one it does (not Hydra's hint to append it with
    ``+``, which a closed group refuses too); None: Hydra's own words stand."""
    from cocodet.errors import ConfigError
    from cocodet.run_spec.schemas import declared_keys
    from cocodet.run_spec.validate import undeclared
    from cocodet.schema import RULES

    cause = error.__cause__ if error.__cause__ is not None else error
    key = str(getattr(cause, "full_key", None) or "")
    group, _, name = key.partition(".")
    rule = next((r for r in RULES if r.key == key), None)
    try:
        if rule is not None and hasattr(cause, "value"):
            rule.validate(cause.value)
        elif declared_keys(group) and name and name not in declared_keys(group):
            undeclared(group, {name}, declared_keys(group))
    except ConfigError as refused:
        return str(refused)
    return None


def _one_line(error: BaseException) -> str:
    """An error and its cause on one line (Hydra spreads its messages over several)."""
    text = str(error).split("Config search path", 1)[0]
    if error.__cause__ is not None and str(error.__cause__) not in text:
        text += " " + str(error.__cause__)
    return " ".join(text.replace("object_type=dict", "").split())
