"""Hydra's hook for cocodet's searching sweeper (``hydra/sweeper=study``).

Hydra instantiates sweepers only from the ``hydra_plugins`` package; the work is in
``cocodet/search/sweep.py``. This module is imported at every Hydra start (plugin discovery), so
it imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper


class StudySweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from omegaconf import OmegaConf

        from cocodet.search.sweep import StudySweep, SweepSettings

        settings = SweepSettings(**OmegaConf.to_container(OmegaConf.create(self.settings), resolve=True))
        return StudySweep(settings, self.config, self.launcher, self.hydra_context).run(arguments)
