"""Parent: what ``prepare`` found, carried to the study's attributes, the driver and the view: no
module global, no second read."""

from dataclasses import dataclass, field
from pathlib import Path

from sweeper import config as C
from sweeper.devices import Slot
from sweeper.study.summary import PanelSummary
from sweeper.study.warm_start import Queue


@dataclass
class Plan:
    """Everything validated before anything is written."""

    cfg: C.SweeperConfig
    storage_url: str
    run_dir: Path
    artifacts: str
    slots: list[Slot]
    panel: PanelSummary
    study_file: str = "STUDY.yaml"  # the study file and its --set, shell-quoted: the lines to paste
    # the parameter sets to enqueue when the study is opened (warm start, config, --enqueue)
    queue: Queue = field(default_factory=Queue)
