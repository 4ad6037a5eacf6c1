"""Where a study lives: one key, ``hydra.sweeper.storage``.

- ``null`` (the default): an SQLite file, ``<hydra.sweep.dir>/study.db``. Started again with the
  same ``hydra.sweep.dir``, the sweep continues the study it holds.
- ``journal:<path>``: an append-only journal file, for a folder several hosts mount (NFS, a
  shared volume); each writer takes the file's lock for its appends.
- an SQLAlchemy URL (``postgresql://user@host/db``, ``mysql+pymysql://...``,
  ``sqlite:////abs/path.db``): a database every host reaches. Its password comes from the
  environment (``${oc.env:...}``), never from a file Hydra writes.
"""

from __future__ import annotations

from pathlib import Path

from cocodet.credentials import redact

JOURNAL = "journal:"
STUDY_FILE = "study.db"


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage as written in the sweep's records (credentials redacted by the caller)."""
    return f"sqlite:///{(sweep_dir / STUDY_FILE).resolve()}" if not storage else str(storage)


def open_storage(storage: str | None, sweep_dir: Path):
    """The study's storage object: an RDB storage (SQLite by default) or a journal file."""
    import optuna

    url = storage_url(storage, sweep_dir)
    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = Path(url[len(JOURNAL) :]).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        # An open(O_EXCL) lock works on NFS and local disks alike, where symlinks may not.
        return optuna.storages.JournalStorage(JournalFileBackend(str(path), JournalFileOpenLock(str(path))))
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    # SQLite under concurrent writers (two launchers on one file): wait for the lock, not fail.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine)


def shown(storage: str | None, sweep_dir: Path) -> str:
    return redact(storage_url(storage, sweep_dir))
