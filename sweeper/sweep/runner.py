"""One trial's life inside a worker: attach to the trial in the store, train it
with the shared core, write its artifacts, and finish it.

Everything the trial produces lives in its folder of the run layout
(:mod:`sweeper.store.layout`) and is also registered in Optuna's artifact store
so optuna-dashboard lists it.
"""
from __future__ import annotations

import json
import math
import os
import socket
import threading
import traceback
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from optuna.trial import TrialState

from sweeper import config as C
from sweeper.atomic import atomic_path
from sweeper.core.checkpoint import FileCheckpointer, checkpoint_epoch, copy_checkpoint
from sweeper.errors import SweeperError, TrialFailure
from sweeper.store import artifact_store, open_storage
from sweeper.store import optuna_private as private
from sweeper.store.layout import ARTIFACTS, TrialFiles, trial_files
from sweeper.sweep import protocol
from sweeper.sweep.heartbeat import Heartbeat
from sweeper.sweep.samplers import build_pruner
from sweeper.sweep.trial_hook import OptunaHook, copy_csv_upto


class TrialRunner:
    """Holds what a worker reuses across trials: the study handle, panels, device."""

    def __init__(self, init: dict[str, Any], stop: threading.Event) -> None:
        self.cfg = C.validate_config(init["config"], "study config")
        self.run_dir = Path(init["run_dir"])
        self.slot = init["slot"]
        self.stop = stop
        self.threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self.device = _pick_device()
        self.storage = open_storage(init["storage"], heartbeat_interval=self.cfg.study.heartbeat_interval,
                                    grace_period=self.cfg.study.grace_period)
        self.study = optuna.load_study(study_name=init["study"], storage=self.storage,
                                       pruner=build_pruner(self.cfg.study.pruner))
        self.artifacts = artifact_store(init["artifacts"])
        self._panels: dict[str, Any] = {}

    def panel(self, cfg: C.SweeperConfig) -> Any:
        from sweeper.data import load_panel

        key = json.dumps(cfg.data.model_dump(mode="json"), sort_keys=True)
        if key not in self._panels:
            self._panels.clear()
            self._panels[key] = load_panel(cfg.data)
        return self._panels[key]

    def run(self, trial_id: int, number: int) -> bool:
        """Train one trial to a finished state; False when the worker must be replaced."""
        files = trial_files(self.run_dir, number)
        files.folder.mkdir(parents=True, exist_ok=True)
        trial = optuna.Trial(self.study, trial_id)
        frozen = self.storage.get_trial(trial_id)
        log = _TrialLog(files.log)
        with Heartbeat(self.storage, trial_id, self.cfg.study.heartbeat_interval):
            self._stamp(trial)
            protocol.emit(protocol.START, number=number, params=frozen.params)
            try:
                state, value, attrs = self._train(trial, frozen, files, log)
            except optuna.exceptions.UpdateFinishedTrialError:
                return self._taken(trial, number)
            except BaseException as exc:  # noqa: BLE001 - a trial may fail any way; the worker must report it
                state, value, attrs = TrialState.FAIL, None, _failure_attrs(exc, log)
            # still beating: recording results must not look like a dead host to the others
            return self._finish(trial, number, state, value, attrs, files)

    def _stamp(self, trial: optuna.Trial) -> None:
        # host, driver_id and driver_pid were written by the driver's claim, under its lock
        attrs = {
            "device": self.slot["label"],
            "slot": self.slot["id"],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
        }
        for key, value in attrs.items():
            trial.set_user_attr(key, value)

    def _train(self, trial: optuna.Trial, frozen: Any, files: TrialFiles, log: "_TrialLog") -> tuple:
        from sweeper.core import train

        cfg = C.with_overrides(self.cfg, frozen.params, f"trial {frozen.number} params")
        files.config.write_text(yaml.safe_dump(C.to_dict(cfg), sort_keys=False))
        self._adopt_checkpoint(trial, frozen, files, log)
        hook = OptunaHook(trial, self.cfg.study.metric, frozen.number, files.metrics, self.stop)
        panel = self.panel(cfg)
        checkpoint = FileCheckpointer(files.checkpoint, sidecar=True)  # the sidecar lets a retry replay epochs
        result = train(cfg, panel, device=self.device, hook=hook, checkpoint=checkpoint, log=log)
        _write_results(files, result)
        state = TrialState.PRUNED if hook.pruned else TrialState.COMPLETE
        value = result.metrics.get(self.cfg.study.metric)
        if state == TrialState.COMPLETE and (value is None or not math.isfinite(value)):
            return TrialState.FAIL, None, {**result.metrics, "fail_reason": "nan",
                                           "error": f"{self.cfg.study.metric} is not finite"}
        return state, value, dict(result.metrics)

    def _adopt_checkpoint(self, trial: optuna.Trial, frozen: Any, files: TrialFiles, log: "_TrialLog") -> None:
        """A retry continues from the interrupted trial's checkpoint, replaying its
        intermediate values up to that epoch exactly once."""
        source = frozen.user_attrs.get("resume_from")
        if not source or files.checkpoint.exists() or checkpoint_epoch(Path(source)) is None:
            return
        epoch = checkpoint_epoch(Path(source))
        copy_checkpoint(Path(source), files.checkpoint)
        previous = self.storage.get_trial(self.storage.get_trial_id_from_study_id_trial_number(
            private.study_id(self.study), int(frozen.user_attrs["retry_of"])))
        for step, value in sorted(previous.intermediate_values.items()):
            if step <= epoch and step not in frozen.intermediate_values:
                trial.report(value, step)
        metrics_csv = TrialFiles(Path(source).parent).metrics
        if metrics_csv.exists():
            copy_csv_upto(metrics_csv, files.metrics, epoch)
        trial.set_user_attr("resumed_from_epoch", epoch)
        log(f"resuming from {source} at epoch {epoch}")

    def _finish(self, trial: optuna.Trial, number: int, state: TrialState, value: float | None,
                attrs: dict[str, Any], files: TrialFiles) -> bool:
        try:
            for key, val in attrs.items():
                trial.set_user_attr(key, _plain(val))
            self._register_artifacts(trial, files)
            values = value if state == TrialState.COMPLETE else None
            self.study.tell(trial, values, state=state, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            return self._taken(trial, number)
        protocol.emit(protocol.END, number=number, state=state.name, value=value, reason=attrs.get("fail_reason"),
             metrics={k: _plain(v) for k, v in attrs.items()})
        return state != TrialState.FAIL

    def _taken(self, trial: optuna.Trial, number: int) -> bool:
        """Another driver finished this trial first (it judged the heartbeat stale):
        the stored outcome stands, and this process is replaced to start clean."""
        stored = self.storage.get_trial(private.trial_id(trial))
        reason = stored.user_attrs.get("fail_reason")
        print(f"trial {number} was already finished as {stored.state.name} ({reason}) by another driver; "
              "its result here is dropped", flush=True)
        protocol.emit(protocol.END, number=number, state=stored.state.name, value=None, reason=reason, metrics={})
        return False

    def _register_artifacts(self, trial: optuna.Trial, files: TrialFiles) -> None:
        from optuna.artifacts import upload_artifact

        for name in ARTIFACTS:
            path = files.folder / name
            if path.exists():
                try:
                    upload_artifact(artifact_store=self.artifacts, file_path=str(path), study_or_trial=trial)
                except Exception:  # noqa: BLE001 - the files stay in the run folder either way
                    pass


def _write_results(files: TrialFiles, result: Any) -> None:
    with atomic_path(files.weights) as tmp:
        torch.save(result.best_state, tmp)
    for split, frame in result.daily.items():
        frame.to_csv(files.daily_ic(split), index=False)


def _failure_attrs(exc: BaseException, log: "_TrialLog") -> dict[str, Any]:
    reason = exc.reason if isinstance(exc, TrialFailure) else "crash"
    log("".join(traceback.format_exception(exc)).rstrip())
    message = str(exc) if isinstance(exc, (TrialFailure, SweeperError)) else f"{type(exc).__name__}: {exc}"
    return {"fail_reason": reason, "error": message[:2000]}


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _pick_device() -> torch.device:
    if os.environ.get("SWEEPER_FAKE_GPU_SLOT"):
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _TrialLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        with self.path.open("a") as fh:
            fh.write(line.rstrip() + "\n")
        print(line, flush=True)  # stdout is the slot log (stderr) in a worker
