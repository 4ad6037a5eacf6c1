"""Lightning's ModelCheckpoint, able to keep its files in a bucket folder (``checkpoint.dir``).

Lightning's callback asks its folder questions (is it empty, does a name exist) through an fsspec
filesystem it opens itself, without the store's options: for ``s3://`` at another endpoint than
AWS's, those requests go to AWS. Here the callback asks through the checkpoint store's own
filesystem (``storage/session.py``: its options and per-request bounds), and whether a name is
taken (a HEAD request, made before each best checkpoint's save) is asked as every other request
is: retried, and a store down for ``give_up_s`` ends the run ``store_down``. Its files are written,
read and removed by the run's checkpoint writer (``models/checkpoint_io.py``), as on local disk.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from cocodet.models import checkpoint_store
from cocodet.models.checkpoint_store import STORE
from cocodet.storage.errors import StoreDown
from cocodet.storage.session import filesystem
from cocodet.storage.urls import is_remote


class ModelCheckpoint(LightningModelCheckpoint):
    def setup(self, trainer, pl_module, stage):
        if not is_remote(str(self.dirpath or "")):
            return super().setup(trainer, pl_module, stage)
        # Lightning's setup, less its own filesystem: the folder every rank agrees on; no
        # "folder not empty" warning (a bucket folder of a resumed run holds its checkpoints).
        self.dirpath = trainer.strategy.broadcast(self.dirpath)
        self._fs = filesystem(self.dirpath, STORE)
        return None

    def file_exists(self, filepath, trainer) -> bool:
        if not is_remote(str(filepath)):
            return super().file_exists(filepath, trainer)
        try:
            taken = checkpoint_store.exists(str(filepath)) if trainer.is_global_zero else False
        except StoreDown as e:
            raise trainer.strategy.checkpoint_io.store_down(e) from None
        return trainer.strategy.broadcast(taken)

    def _should_remove_checkpoint(self, trainer, previous: str, current: str) -> bool:
        # Lightning removes any remote previous file; a local one only from its own folder, and
        # never the one the run resumed from. The same rules in a bucket: a run resumed from
        # another run's folder keeps that run's checkpoint.
        if not is_remote(str(previous)):
            return super()._should_remove_checkpoint(trainer, previous, current)
        if previous == current or (trainer.ckpt_path is not None and str(trainer.ckpt_path) == previous):
            return False
        return previous.rsplit("/", 1)[0] == str(self.dirpath).rstrip("/")
