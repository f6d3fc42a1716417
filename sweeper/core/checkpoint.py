"""The checkpoint format, in one place: what a state holds, how it is saved and restored,
and which run it may continue.

A state holds tensors, numbers, strings, lists and dicts only, so it loads with
``torch.load(weights_only=True)``. It is one file, replaced atomically at every save, that names its own epoch
and config (no sidecar file could name another epoch): :func:`checkpoint_meta` reads them through a memory map
without loading the tensors, so that a retry can replay exactly the intermediate values its checkpoint covers.
"""

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sweeper.atomic import atomic_path
from sweeper.config import SweeperConfig, flatten, to_dict
from sweeper.config.drift import CHECKPOINT_SECTIONS, differing_keys
from sweeper.core.batch_plan import BatchPlan
from sweeper.core.lanes import Lane
from sweeper.core.step import StackStep
from sweeper.errors import StopReason

# what a checkpoint keeps of a run's Progress (a lone run's, or a stack member's)
PROGRESS_KEYS = ("best", "best_epoch", "best_state", "best_metrics", "bad_epochs", "nonfinite_steps",
                 "history")


class FileCheckpointer:
    """One checkpoint file, replaced atomically at every save.

    ``owner`` is stamped into every state it saves: whose run the checkpoint is (for a sweep,
    the study's uuid, the trial's number and the panel's fingerprint), so that only that run's
    retry ever continues it (:mod:`sweeper.worker.adoption`). The core does not read it."""

    def __init__(self, path: str | Path, owner: dict[str, Any] | None = None) -> None:
        self.path, self.owner = Path(path), owner

    def load(self) -> dict | None:
        return torch.load(self.path, map_location="cpu", weights_only=True) if self.path.exists() else None

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
    return None if (meta := checkpoint_meta(path)) is None else meta["epoch"]


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy a checkpoint (a retry adopting the interrupted trial's state), atomically."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def stack_state(cfg: SweeperConfig, epoch: int, lanes: list[Lane], step: StackStep, plan: BatchPlan) -> dict:
    """The whole stack after ``epoch``: weights, optimizer and scales, and each member's own
    generators, schedule position and progress (its best weights among them)."""
    dropout: list[torch.Tensor | None] = [g.get_state().cpu() for g in step.dropout] or [None] * len(lanes)
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # legacy=True, the default: (name, keys, pos, has_gauss, gauss)
    version, py_state, gauss = random.getstate()
    return {
        "epoch": epoch, "kind": "stack", "values": step.flat.values.detach().to("cpu", copy=True),
        "optimizer": {k: v.to("cpu", copy=True) for k, v in step.optimizer.state_dict().items()},
        "scaler": {"scale": step.scaler.scale_.cpu(), "good": step.scaler.good.cpu()},
        "rng": {"torch": torch.get_rng_state(),
                "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else [],
                "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                          "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
                "python": {"version": version, "state": list(py_state), "gauss": gauss},
                "batches": lanes[0].generator.get_state()},
        "members": [{"batches": lane.generator.get_state(), "dropout": gen, "position": lane.position,
                     "stopped": lane.stopped, "reason": lane.reason or "",
                     **{k: getattr(lane.progress, k) for k in PROGRESS_KEYS}}
                    for lane, gen in zip(lanes, dropout)],
        "batch_size": plan.batch_size, "micro_batch_size": plan.micro_batch,
        "eval_batch_size": plan.eval_batch_size, "config": to_dict(cfg, kept=True)}


def member_states(state: dict, which: Sequence[int], cfg: SweeperConfig) -> dict:
    """The members ``which`` of a :func:`stack_state`, as a stack of them alone (trained under ``cfg``)
    saves it: a population's trial keeps its own checkpoint, and its retry continues it without the
    others (its rows of the flat buffers, moments, scales and its members' own states)."""
    rows = torch.tensor(list(which), dtype=torch.long)
    members = [state["members"][k] for k in which]
    rng = state["rng"]
    if len(members) == 1 and (own := members[0]["dropout"]) is not None and own.numel():
        # alone it draws dropout from the global generator: the CPU's, or on a GPU the CUDA one's (16 bytes)
        key, value = ("torch", own) if own.numel() == torch.get_rng_state().numel() else ("cuda", [own])
        rng, members = {**rng, key: value}, [{**members[0], "dropout": None}]
    share = len(state["members"]) // len(members)  # the stack's evaluation rows, shared by fewer
    return {**state, "values": state["values"][rows],
            "optimizer": {k: v[rows] for k, v in state["optimizer"].items()},
            "scaler": {k: v[rows] for k, v in state["scaler"].items()}, "rng": rng, "members": members,
            "eval_batch_size": state["eval_batch_size"] * share, "config": to_dict(cfg, kept=True)}


def restore_stack(state: dict, step: StackStep) -> int:
    """Continue from :func:`stack_state` (or from a lone run's checkpoint of an older sweeper, as
    the stack of one it now is); returns the epoch it holds."""
    lanes = step.lanes
    state = state if state.get("kind") == "stack" else _from_lone(state, step)
    if len(state["members"]) != len(lanes):
        raise ValueError("the checkpoint is not this stack's")
    with torch.no_grad():
        step.flat.values.copy_(state["values"])
    step.optimizer.load_state_dict(state["optimizer"])
    step.scaler.scale_.copy_(state["scaler"]["scale"])
    step.scaler.good.copy_(state["scaler"]["good"])
    rng, n, p = state["rng"], state["rng"]["numpy"], state["rng"]["python"]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    lanes[0].generator.set_state(rng["batches"])
    for k, (lane, saved) in enumerate(zip(lanes, state["members"])):
        lane.generator.set_state(saved["batches"])
        if step.dropout:
            step.dropout[k].set_state(saved["dropout"].cpu())  # a generator's state is a CPU tensor
        lane.position, lane.stopped = int(saved["position"]), bool(saved["stopped"])
        lane.reason = StopReason(saved["reason"]) if saved.get("reason") else None
        for key in PROGRESS_KEYS:
            setattr(lane.progress, key, saved[key])
        lane.progress.epoch, lane.progress.history = int(state["epoch"]), list(saved["history"])
    return int(state["epoch"])


def _from_lone(state: dict, step: StackStep) -> dict:
    """A checkpoint of the lone loop (sweepers before the one core) as the stack of one's state: its weights
    and torch AdamW state re-laid into the flat buffers, its schedule's position, its GradScaler's scale."""
    if len(step.lanes) != 1 or step.optimizer.torch_adamw is None:
        raise ValueError("the checkpoint is not this stack's")
    step.stack.load_member(0, state["model"])  # into the flat buffers: the parameters are views of them
    step.optimizer.torch_adamw.load_state_dict(state["optimizer"])
    moments = step.optimizer.adopt_torch_state()
    scaler = state.get("scaler") or {}
    progress = {k: state[k] for k in PROGRESS_KEYS}
    stopped = int(state["bad_epochs"]) >= step.lanes[0].cfg.train.patience
    return {**state, "values": step.flat.values.detach().clone(), "optimizer": moments,
            "scaler": {"scale": torch.tensor([float(scaler.get("scale", step.scaler.scale_[0]))]),
                       "good": torch.tensor([float(scaler.get("_growth_tracker", 0))])},
            "members": [{"batches": state["rng"]["batches"], "dropout": None,
                         "position": int(state["scheduler"]["last_epoch"]), "stopped": stopped, **progress}]}


def config_mismatch(stored: dict, cfg: SweeperConfig) -> str | None:
    """Why a checkpoint written under config ``stored`` cannot continue a run of ``cfg``
    (model, train and data must match); None when it can."""
    current = to_dict(cfg)
    if not (diffs := differing_keys(stored, current, CHECKPOINT_SECTIONS)):
        return None
    # the values again from the flat dicts: differing_keys spells a missing key "<unset>",
    # this message has always said None
    key = diffs[0][0]
    old, new = flatten(stored).get(key), flatten(current).get(key)
    return f"the checkpoint was written by a different run: {key} was {old!r}, now {new!r}"
