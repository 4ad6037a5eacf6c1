"""Credentials stay in the environment: refused as overrides and in config files (bottom layer).

Two kinds: a bucket's (s3fs/botocore, the fsspec options) and an MLflow server's
(``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` / ``_TOKEN``, or a ``user:password@`` URI).

Hydra writes every override to ``.hydra/overrides.yaml`` and the composed config to
``.hydra/config.yaml`` before the task runs, and the config reaches the logs and TensorBoard's
hyper-parameters; a key or secret given there would be on disk in every run folder. So the
command line is checked in ``cli.main`` before Hydra starts, and the composed config in
``run_spec/validate.py``. The standard AWS chain (environment variables, ``AWS_PROFILE``, an
instance role, web identity) needs nothing from cocodet's config.
"""

from __future__ import annotations

import re

# A key name that holds a credential: s3fs's key/secret/token, botocore's aws_* names, and the
# usual spellings of other fsspec implementations (password, account_key, sas_token, credentials).
_CREDENTIAL_NAME = re.compile(
    r"(^|_)(key|secret|token|password|passwd|credentials?)$"
    r"|^aws_(access_key_id|secret_access_key|session_token|security_token)$",
    re.I,
)
# Names that are a credential wherever they appear: AWS's and MLflow's environment variables.
_ALWAYS = re.compile(
    r"aws_(access_key_id|secret_access_key|session_token|security_token)"
    r"|mlflow_tracking_(username|password|token)",
    re.I,
)
# Where such a name is a credential: fsspec's options, Hydra's env_set (it sets variables), and
# the MLflow logger's options (logger.mlflow.*).
_SCOPES = ("storage_options", "env_set", "mlflow")
_USERINFO = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://[^/@\s]+:[^/@\s]*@")  # scheme://user:password@host
ADVICE = (
    "put credentials in the environment instead (a bucket's: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
    'AWS_SESSION_TOKEN or AWS_PROFILE, README "Data in a bucket"; an MLflow server\'s: MLFLOW_TRACKING_USERNAME '
    'and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, README "Tracking runs in MLflow"; in Kubernetes, a '
    "Secret) and leave them out of overrides and config files"
)


def is_credential(dotted_key: str) -> bool:
    """Whether a config key (``dataset.storage_options.secret``) names a credential."""
    parts = dotted_key.lstrip("+~").split(".")
    if _CREDENTIAL_NAME.search(parts[-1]) and any(scope in parts[:-1] for scope in _SCOPES):
        return True
    return bool(_ALWAYS.fullmatch(parts[-1]))


def refused_override(argument: str) -> str | None:
    """The one-line reason to refuse a command-line override, or None. Never repeats the value."""
    key, sep, value = argument.partition("=")
    if not sep:
        return None
    if is_credential(key):
        return f"{key.lstrip('+~')} is a credential given as an override (Hydra writes overrides to .hydra/): {ADVICE}"
    if _USERINFO.search(value):
        return (
            f"{key.lstrip('+~')} holds a URL with a user name and password (scheme://user:password@host), which "
            f"Hydra would write to .hydra/: {ADVICE}"
        )
    return None


_ANY_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@\s]+@")  # a password, or a token alone


def redact(text) -> str:
    """``text`` with the user part of every URL in it (``user:password@``, ``token@``) replaced by ``***@``."""
    return _ANY_USERINFO.sub(lambda m: f"{m.group('scheme')}***@", str(text))


def has_userinfo(value) -> bool:
    """Whether ``value`` holds a URL with a user name and password."""
    return isinstance(value, str) and bool(_USERINFO.search(value))


def credential_keys(options, prefix: str) -> list[str]:
    """The dotted keys of a mapping (nested) that name credentials, e.g. in dataset.storage_options."""
    found = []
    for name, value in (options or {}).items():
        key = f"{prefix}.{name}"
        if isinstance(value, dict):
            found.extend(credential_keys(value, key))
        elif (is_credential(key) and value is not None) or has_userinfo(value):
            found.append(key)
    return found
