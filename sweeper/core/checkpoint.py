"""The checkpoint format, in one place: what a state holds, how it is saved and restored,
which run it may continue, and the JSON sidecar that names its epoch.

A state holds tensors, numbers, strings, lists and dicts only, so it loads with
``torch.load(weights_only=True)``. ``<name>.pt`` and its sidecar ``<name>.json``
(``{"epoch": n}``) are each replaced atomically; the sidecar lets a retry read the
saved epoch without loading the tensors, and replay exactly the intermediate values
its checkpoint covers.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from sweeper.atomic import atomic_path, write_text
from sweeper.config import SweeperConfig, flatten, to_dict
from sweeper.config.drift import CHECKPOINT_SECTIONS, differing_keys
from sweeper.core.progress import Progress, cpu_copy
from sweeper.errors import ConfigError


class FileCheckpointer:
    """One checkpoint file, replaced atomically at every save.

    With ``sidecar=True`` each save then writes ``<path>.json`` (suffix replaced) naming the
    saved epoch, for :func:`checkpoint_epoch` and :func:`copy_checkpoint`.
    """

    def __init__(self, path: str | Path, *, sidecar: bool = False) -> None:
        self.path = Path(path)
        self.sidecar = self.path.with_suffix(".json") if sidecar else None

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        return torch.load(self.path, map_location="cpu", weights_only=True)

    def save(self, state: dict) -> None:
        with atomic_path(self.path) as tmp:
            torch.save(state, tmp)
        # after the checkpoint: a sidecar never names an epoch its checkpoint does not hold
        if self.sidecar is not None:
            write_text(self.sidecar, json.dumps({"epoch": int(state["epoch"])}))


def checkpoint_epoch(path: Path) -> int | None:
    """The epoch a checkpoint holds, from its sidecar; None unless both files exist."""
    sidecar = path.with_suffix(".json")
    if not (path.exists() and sidecar.exists()):
        return None
    return int(json.loads(sidecar.read_text())["epoch"])


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy a checkpoint and its sidecar (a retry adopting the interrupted trial's state)."""
    shutil.copyfile(src, dst)
    shutil.copyfile(Path(src).with_suffix(".json"), Path(dst).with_suffix(".json"))


def training_state(cfg: SweeperConfig, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
                   scaler: torch.amp.GradScaler, generator: torch.Generator, progress: Progress,
                   batch_size: int, micro: int) -> dict:
    return {
        "epoch": progress.epoch, "model": cpu_copy(model.state_dict()), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(generator),
        "best": progress.best, "best_epoch": progress.best_epoch, "best_state": progress.best_state,
        "best_metrics": progress.best_metrics, "bad_epochs": progress.bad_epochs,
        "nonfinite_steps": progress.nonfinite_steps, "history": progress.history,
        "batch_size": batch_size, "micro_batch_size": micro, "config": to_dict(cfg),
    }


def restore(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
            scaler: torch.amp.GradScaler, generator: torch.Generator, progress: Progress) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], generator)
    progress.epoch, progress.best, progress.best_epoch = state["epoch"], state["best"], state["best_epoch"]
    progress.best_state, progress.best_metrics = state["best_state"], state["best_metrics"]
    progress.bad_epochs, progress.nonfinite_steps = state["bad_epochs"], state["nonfinite_steps"]
    progress.history = list(state["history"])


def rng_state(generator: torch.Generator) -> dict:
    np_state = np.random.get_state()
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


def check_same_config(state: dict, cfg: SweeperConfig) -> None:
    """A checkpoint continues only the run it came from: model, train and data must match."""
    stored, current = state.get("config", {}), to_dict(cfg)
    diffs = differing_keys(stored, current, CHECKPOINT_SECTIONS)
    if diffs:
        # the values again from the flat dicts: differing_keys spells a missing key "<unset>",
        # this message has always said None
        key = diffs[0][0]
        old, new = flatten(stored).get(key), flatten(current).get(key)
        raise ConfigError(f"the checkpoint was written by a different run: {key} was {old!r}, now {new!r}")
