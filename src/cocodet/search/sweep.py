"""A sweep that searches: the study's ask-and-tell loop behind ``hydra/sweeper=study``.

Each round asks the study for as many trials as run at once (``n_jobs``), launches them with the
configured launcher (each in ``<hydra.sweep.dir>/<trial number>``), and tells the study each
trial's figure (``train()``'s return value) or its failure, in one line. It ends when the study
holds ``n_trials`` finished trials, counting those of earlier launches and of other launchers
on the same storage; trials a launcher left running are failed and asked again
(``search/trials.py``). At the end: ``best.yaml``, the command that reuses it, the trials'
table and the study's plots (``search/winner.py``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cocodet.errors import ConfigError
from cocodet.search import space, trials
from cocodet.search.objective import direction, metric_name
from cocodet.search.storage import open_storage, shown

log = logging.getLogger(__name__)

STUDY_RECORD = "study.json"  # what the report and a continuing launch read back: storage, name, metric


@dataclass
class SweepSettings:
    """``hydra.sweeper``'s keys (``conf/hydra/sweeper/study.yaml``)."""

    n_trials: int = 20
    n_jobs: int | str = "auto"
    storage: str | None = None
    study_name: str = "cocodet"
    seed: int | None = 0
    exclusive: bool = False
    heartbeat_s: float = 10.0
    params: dict = field(default_factory=dict)


def parallelism(settings: SweepSettings, launcher_cfg: DictConfig) -> int:
    """Trials asked at once: ``n_jobs``, or (auto) the launcher's own parallelism."""
    target = str(launcher_cfg.get("_target_", ""))
    launcher_jobs = launcher_cfg.get("n_jobs") or launcher_cfg.get("array_parallelism") or 1
    if settings.exclusive and target.endswith("JoblibLauncher") and int(launcher_jobs) != 1:
        raise ConfigError(
            f"this search measures the host's cores, one trial at a time: hydra/launcher=local_parallel "
            f"(n_jobs={launcher_jobs}) would run {launcher_jobs} trials on the same cores, each measuring "
            "the others; leave the launcher out (one trial at a time)"
        )
    jobs = int(launcher_jobs) if settings.n_jobs == "auto" else int(settings.n_jobs)
    if settings.exclusive and jobs != 1:
        raise ConfigError(f"hydra.sweeper.n_jobs={jobs}: this search measures the host, one trial at a time (n_jobs=1)")
    if jobs < 1:
        raise ConfigError(f"hydra.sweeper.n_jobs={jobs}: expected auto or an integer >= 1")
    return jobs


class StudySweep:
    def __init__(self, settings: SweepSettings, config: DictConfig, launcher, hydra_context):
        self.settings, self.config, self.launcher, self.hydra_context = settings, config, launcher, hydra_context
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.metric = metric_name(str(config.mode), config.get("optimized_metric"))
        if self.metric is None:
            raise ConfigError(
                f"mode={config.mode} returns no figure to search on: name one with optimized_metric=KEY "
                "(a numeric top-level key of the mode's summary)"
            )
        self.direction = direction(self.metric, config.get("optimized_direction"))
        self.jobs = parallelism(settings, config.hydra.launcher)

    def run(self, arguments: list[str]) -> list:
        import optuna

        fixed, searched = self._split(arguments)
        dists = space.distributions({**dict(self.settings.params or {}), **searched})
        if not dists:
            raise ConfigError("hydra.sweeper.params is empty: nothing to search (an hparams_search=... group sets it)")
        lists = {key: list(OmegaConf.select(self.config, key) or []) for key in space.list_settings(dists)}
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        storage = open_storage(self.settings.storage, self.sweep_dir)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            storage=storage,
            study_name=self.settings.study_name,
            direction=self.direction,
            sampler=optuna.samplers.TPESampler(seed=self.settings.seed),
            load_if_exists=True,
        )
        self._record(fixed)
        log.info(
            "study %s in %s: %s of %s, %d trials to finish, %d at a time",
            self.settings.study_name,
            shown(self.settings.storage, self.sweep_dir),
            self.direction,
            self.metric,
            self.settings.n_trials,
            self.jobs,
        )
        returns = []
        while True:
            trials.fail_stale(study, storage, self.settings.heartbeat_s)
            done, running = trials.tally(study)
            if done >= self.settings.n_trials:
                break
            want = min(self.jobs, self.settings.n_trials - done - running)
            if want <= 0:  # a peer's trials finish the study, unless their launcher stops
                time.sleep(self.settings.heartbeat_s)
                continue
            asked = [study.ask(fixed_distributions=dists) for _ in range(want)]
            returns.append(self._launch(study, storage, asked, fixed, lists))
        from cocodet.search.winner import conclude

        conclude(study, self.sweep_dir, fixed, self.metric, self.direction, lists)
        return returns

    def _split(self, arguments: list[str]) -> tuple[list[str], dict]:
        """The command line's fixed overrides, and its sweeps (searched as the params are)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        fixed, searched = [], {}
        for argument, override in zip(arguments, OverridesParser.create().parse_overrides(arguments)):
            if override.is_sweep_override():
                searched[override.get_key_element()] = argument.split("=", 1)[1]
            else:
                fixed.append(argument)
        return fixed, searched

    def _launch(self, study, storage, asked: list, fixed: list[str], lists: dict) -> list:
        from optuna.trial import TrialState

        batch, ready = [], []
        for trial in asked:
            if trials.surplus(study, trial.number, self.settings.n_trials):
                self._tell_failed(study, trial, trials.SURPLUS)
                continue
            job = [*fixed, *space.overrides(trial.params, lists), f"hydra.sweep.subdir={trial.number}"]
            try:  # a setting the config refuses at composition fails its trial, not the sweep
                self.hydra_context.config_loader.load_sweep_config(master_config=self.config, sweep_overrides=job)
            except Exception as e:  # noqa: BLE001
                self._tell_failed(study, trial, " ".join(str(e).split()))
                continue
            batch.append(job)
            ready.append(trial)
        if not batch:
            return []
        with trials.Heartbeat(storage, [t._trial_id for t in ready], self.settings.heartbeat_s):
            results = self.launcher.launch(batch, initial_job_idx=ready[0].number)
        for trial, result in zip(ready, results):
            try:
                value = result.return_value
            except Exception as e:  # noqa: BLE001 - the job's error (cli raises a user error's one line)
                self._tell_failed(study, trial, " ".join(str(e).split()))
                continue
            if value is None:
                self._tell_failed(study, trial, f"the job returned no {self.metric}")
                continue
            study.tell(trial, float(value), state=TrialState.COMPLETE)
            log.info(
                "trial %d: %s = %g (%s)",
                trial.number,
                self.metric,
                value,
                " ".join(space.overrides(trial.params, lists)),
            )
        return results

    def _tell_failed(self, study, trial, reason: str) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr(trials.FAILURE, reason[:1000])
        study.tell(trial, state=TrialState.FAIL)
        log.warning("trial %d failed: %s", trial.number, reason[:300])

    def _record(self, fixed: list[str]) -> None:
        record = {
            "storage": shown(self.settings.storage, self.sweep_dir),
            "study_name": self.settings.study_name,
            "metric": self.metric,
            "direction": self.direction,
            "fixed": fixed,
        }
        (self.sweep_dir / STUDY_RECORD).write_text(json.dumps(record, indent=1) + "\n")
