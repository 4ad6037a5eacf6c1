"""Lightning's ModelCheckpoint, able to keep its files in a bucket folder (``checkpoint.dir``).

Lightning's callback asks its folder questions (is it empty, does a name exist) through an fsspec
filesystem it opens itself, without the store's options: for ``s3://`` at another endpoint than
AWS's, those requests go to AWS. Here the callback asks through the checkpoint store's own
filesystem (``storage/session.py``: its options and per-request bounds). Its files are written,
read and removed by the run's checkpoint writer (``models/checkpoint_io.py``), as on local disk.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from cocodet.models.checkpoint_store import STORE
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
