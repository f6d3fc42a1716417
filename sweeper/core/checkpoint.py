"""The checkpoint format, in one place: what a state holds, how it is saved and restored,
and which run it may continue.

A state holds tensors, numbers, strings, lists and dicts only, so it loads with
``torch.load(weights_only=True)``. It is one file, replaced atomically at every
save, and it names its own epoch and config: :func:`checkpoint_meta` reads them
through a memory map without loading the tensors, so that a retry can replay
exactly the intermediate values its checkpoint covers. (There is no sidecar
file that could name another epoch than the checkpoint holds.)
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from sweeper.atomic import atomic_path
from sweeper.config import SweeperConfig, flatten, to_dict
from sweeper.config.drift import CHECKPOINT_SECTIONS, differing_keys
from sweeper.core.progress import Progress, cpu_copy
from sweeper.errors import ConfigError


class FileCheckpointer:
    """One checkpoint file, replaced atomically at every save.

    ``owner`` is stamped into every state it saves: whose run the checkpoint is (for a sweep,
    the study's uuid, the trial's number and the panel's fingerprint), so that only that run's
    retry ever continues it (:mod:`sweeper.worker.adoption`). The core does not read it."""

    def __init__(self, path: str | Path, owner: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.owner = owner

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        return torch.load(self.path, map_location="cpu", weights_only=True)

    def save(self, state: dict) -> None:
        if self.owner is not None:
            state = {**state, "owner": self.owner}
        with atomic_path(self.path) as tmp:
            torch.save(state, tmp)


def checkpoint_meta(path: str | Path) -> dict[str, Any] | None:
    """``{"epoch", "config", "owner"}`` of a checkpoint, read through a memory map (the tensors
    stay on disk); None when there is no file or it cannot be read as a checkpoint. ``owner`` is
    None for a checkpoint saved without one (by an older sweeper, or ``sweeper train``)."""
    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
        return {"epoch": int(state["epoch"]), "config": state.get("config", {}), "owner": state.get("owner")}
    except Exception:  # noqa: BLE001 - missing or unreadable: there is nothing to resume from
        return None


def checkpoint_epoch(path: str | Path) -> int | None:
    """The epoch a checkpoint holds; None when there is none."""
    meta = checkpoint_meta(path)
    return None if meta is None else meta["epoch"]


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy a checkpoint (a retry adopting the interrupted trial's state), atomically."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def training_state(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: LambdaLR, scaler: torch.amp.GradScaler, generator: torch.Generator,
                   progress: Progress, batch_size: int, micro: int) -> dict:
    return {
        "epoch": progress.epoch, "model": cpu_copy(model.state_dict()), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(generator),
        **progress_state(progress), "batch_size": batch_size, "micro_batch_size": micro,
        "config": to_dict(cfg),
    }


def progress_state(progress: Progress) -> dict:
    """What a checkpoint keeps of a run's :class:`Progress` (a lone run's, or a stack member's)."""
    return {"best": progress.best, "best_epoch": progress.best_epoch, "best_state": progress.best_state,
            "best_metrics": progress.best_metrics, "bad_epochs": progress.bad_epochs,
            "nonfinite_steps": progress.nonfinite_steps, "history": progress.history}


def restore_progress(state: dict, progress: Progress, epoch: int) -> None:
    progress.epoch, progress.best, progress.best_epoch = epoch, state["best"], state["best_epoch"]
    progress.best_state, progress.best_metrics = state["best_state"], state["best_metrics"]
    progress.bad_epochs, progress.nonfinite_steps = state["bad_epochs"], state["nonfinite_steps"]
    progress.history = list(state["history"])


def restore(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
            scaler: torch.amp.GradScaler, generator: torch.Generator, progress: Progress) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], generator)
    restore_progress(state, progress, state["epoch"])


def rng_state(generator: torch.Generator) -> dict:
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # legacy=True, the default: (name, keys, pos, has_gauss, gauss)
    version, py_state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else [],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": version, "state": list(py_state), "gauss": gauss},
        "batches": generator.get_state(),
    }


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    generator.set_state(state["batches"])


def config_mismatch(stored: dict, cfg: SweeperConfig) -> str | None:
    """Why a checkpoint written under config ``stored`` cannot continue a run of ``cfg``
    (model, train and data must match); None when it can."""
    current = to_dict(cfg)
    diffs = differing_keys(stored, current, CHECKPOINT_SECTIONS)
    if not diffs:
        return None
    # the values again from the flat dicts: differing_keys spells a missing key "<unset>",
    # this message has always said None
    key = diffs[0][0]
    old, new = flatten(stored).get(key), flatten(current).get(key)
    return f"the checkpoint was written by a different run: {key} was {old!r}, now {new!r}"


def check_same_config(state: dict, cfg: SweeperConfig) -> None:
    """A checkpoint continues only the run it came from: model, train and data must match."""
    problem = config_mismatch(state.get("config", {}), cfg)
    if problem:
        raise ConfigError(problem)
