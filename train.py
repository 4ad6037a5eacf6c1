"""Entry point: python train.py [group=option] [key=value ...] (see README)."""

import hydra
from omegaconf import DictConfig

from cocodet.cli import main, task


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float | None:
    return task(cfg)  # the run's figure (optimized_metric), what a sweeper optimises


if __name__ == "__main__":
    main(train)
