"""A stack's members (a config and its fold's panel) and their lanes: everything a run carries
through the loop (its data, generators, schedule position, progress and this epoch's steps)."""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sweeper.config import SweeperConfig, TrainConfig
from sweeper.core.device import seed_everything
from sweeper.core.progress import EpochSteps, Progress
from sweeper.core.schedule import DateRuns, Rows, count_steps, lr_factor
from sweeper.data import Batcher, Panel
from sweeper.errors import StopReason
from sweeper.models import build_model


@dataclass
class Member:
    """One run of a stack: its config (its own ``train.seed``, any per-member setting), panel and log."""

    cfg: SweeperConfig
    panel: Panel
    log: Callable[[str], None] | None = None  # its epoch and done lines' (its trial's); None: the stack's


@dataclass
class Lane:
    """A member's own state in the loop: everything a run keeps."""

    cfg: SweeperConfig
    panel: Panel
    batcher: Batcher
    valid: Batcher
    generator: torch.Generator
    runs: DateRuns | None
    steps_per_epoch: int
    factor: Callable[[int], float]
    progress: Progress = field(default_factory=Progress)
    position: int = 0  # schedule steps taken (LambdaLR's last_epoch)
    stopped: bool = False
    # why it stopped before the stack ended, where that is not its patience (early stopping): its own
    # train.epochs ran out, its trial was pruned (a population), or it failed (``failure`` says how)
    reason: StopReason | None = None
    failure: str | None = None
    rows: Iterator[Rows] | None = None
    steps: EpochSteps = field(default_factory=EpochSteps)
    seen: int = 0
    # the global generator's state once the member's model was built: where its lone run's draws
    # (dropout) would have started
    rng: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))
    best_valid: torch.Tensor | None = None  # its best epoch's valid predictions (see loop._validate)
    result: Any = None  # its TrainResult once scored (loop._finish; a pruned one before the stack ends)
    log: Callable[[str], None] | None = None  # Member.log

    def new_epoch(self) -> None:
        self.steps, self.seen = EpochSteps(), 0


def build_lane(member: Member, device: torch.device) -> tuple[Lane, torch.nn.Module]:
    """The member's lane, and its one-member model built after seeding with the member's seed (its
    lone run's initial weights, draw for draw)."""
    cfg, tc = member.cfg, member.cfg.train
    seed_everything(tc.seed)
    panel = member.panel.to(device, cfg.data.device_share)
    solo = build_model(cfg.model, len(panel.features), panel.lookback).to(device)
    batcher = Batcher(panel, "train", device)
    order = tc.resolved_batch_order
    steps = count_steps(batcher, order, _capped(tc, [batcher]), tc.samples_per_epoch)
    return Lane(cfg, panel, batcher, Batcher(panel, "valid", device), torch.Generator().manual_seed(tc.seed),
                DateRuns(batcher) if order == "cross_section" else None, steps,
                lr_factor(tc.schedule, tc.warmup_frac, steps * tc.epochs),
                rng=torch.get_rng_state(), log=member.log), solo  # rng: taken after the model's draws


def lane_batch_size(tc: TrainConfig, lanes: Sequence[Lane]) -> int:
    """``train.batch_size`` capped at the smallest member's train split (``auto``: its cap)."""
    return _capped(tc, [lane.batcher for lane in lanes])


def _capped(tc: TrainConfig, batchers: Sequence[Batcher]) -> int:
    samples = min(b.n_samples for b in batchers)
    return min(tc.max_batch_size if tc.batch_size == "auto" else int(tc.batch_size), max(1, samples))
