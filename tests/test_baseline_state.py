"""The baseline's states (sweeper.baseline.state): the one claim rule, the exact stored value after
each transition, the job's exit codes, and the sweep's job and worker turn following them. Fast:
an in-memory study, no subprocess."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import optuna
import pytest

from conftest import TINY, merge
from sweeper import launch
from sweeper.baseline import state as S
from sweeper.baseline.state import CLAIMABLE, ExitCode, State
from sweeper.config import validate_config
from sweeper.devices.nvml import GPU
from sweeper.devices.slots import Slot
from sweeper.dispatch.baseline_job import BaselineJob
from sweeper.dispatch.handle import WorkerHandle
from sweeper.dispatch.strategies import PackedDispatch, SlotDispatch, honours_turn
from sweeper.store.identity import Identity
from sweeper.store.locks import NullLock

AT = "2026-01-02T03:04:05+00:00"


@pytest.fixture
def study(monkeypatch):
    monkeypatch.setattr(S, "_now", lambda: AT)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study()


def _stored(study):
    return study.user_attrs.get("baseline_state")


def _who(host, driver, pid=4242):
    return Identity(host=host, pid=pid, driver_id=driver, pid_ns="boot:pid:[1]")


def test_the_stored_names_and_exit_codes_are_the_ones_on_disk():
    assert S.ATTR == "baseline_state"
    assert [s.value for s in State] == ["running", "done", "failed", "interrupted"]
    assert (ExitCode.DONE, ExitCode.FAILED, ExitCode.STORE_AWAY) == (0, 1, 75)
    assert set(CLAIMABLE) == {"interrupted"}


@pytest.mark.parametrize("stored, claimable", [
    (None, True), ({"state": "interrupted"}, True),
    ({"state": "running"}, False), ({"state": "done"}, False), ({"state": "failed"}, False)])
def test_the_claim_rule(stored, claimable):
    assert S.claimable(stored) is claimable


def test_a_claim_writes_running_once_and_an_interrupted_run_is_claimed_again(study):
    assert S.claim(study, NullLock(), _who("h1", "d1")) is True
    first = {"state": "running", "host": "h1", "driver": "d1", "at": AT, "pid": 4242, "pid_ns": "boot:pid:[1]"}
    assert _stored(study) == first
    assert S.claim(study, NullLock(), _who("h2", "d2")) is False  # running: taken
    assert _stored(study) == first
    assert S.settle(study, State.INTERRUPTED, "h1", "d1", S.STOPPED) is True
    assert _stored(study) == {"state": "interrupted", "host": "h1", "driver": "d1", "at": AT,
                              "error": "the sweep stopped before the baseline ended"}
    assert S.claim(study, NullLock(), _who("h2", "d2")) is True
    assert _stored(study) == {"state": "running", "host": "h2", "driver": "d2", "at": AT, "pid": 4242,
                              "pid_ns": "boot:pid:[1]"}


@pytest.mark.parametrize("end", [State.DONE, State.FAILED])
def test_done_and_failed_are_never_claimed_again(study, end):
    S.mark(study, end, "h1", "d1", error="LightGBMError: x" if end is State.FAILED else None)
    before = dict(_stored(study))
    assert before == {"state": str(end), "host": "h1", "driver": "d1", "at": AT,
                      **({"error": "LightGBMError: x"} if end is State.FAILED else {})}
    assert S.claim(study, NullLock(), _who("h2", "d2")) is False
    assert _stored(study) == before


def test_a_running_baseline_whose_driver_died_is_claimed_again_where_its_pid_is_seen_gone(study):
    """A driver killed -9 (or by the OOM killer) while its baseline ran left it ``running`` for good: no
    later sweep computed it. Another driver of the same process table takes it over; one that cannot
    see that pid (another host or namespace) cannot tell, and a live driver's run is left alone."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    dead = next(pid for pid in range(top - 1, 1, -1) if not Path(f"/proc/{pid}").exists())  # no such process
    here = Identity.current()
    S.claim(study, NullLock(), Identity(here.host, dead, "d1", here.pid_ns))
    assert _stored(study)["pid"] == dead and _stored(study)["pid_ns"] == here.pid_ns
    assert S.claim(study, NullLock(), Identity("elsewhere", 1, "d2", here.pid_ns)) is False
    assert S.claim(study, NullLock(), Identity(here.host, 1, "d2", "another:ns")) is False
    assert S.claim(study, NullLock(), here) is True
    assert _stored(study)["driver"] == here.driver_id and _stored(study)["pid"] == os.getpid()
    assert S.claim(study, NullLock(), Identity(here.host, 1, "d3", here.pid_ns)) is False  # it lives
    assert not S.claimable({"state": "running", "host": here.host, "driver": "d0"}, here)  # older: no pid


def test_the_running_job_stamps_its_own_pid_so_a_later_sweep_here_can_judge_it(study, monkeypatch, tmp_path):
    """The job re-marks ``running`` as it starts (a sweep claimed it, or ``sweeper baseline`` asked): with
    no pid that mark hid the claim's, and a killed sweep's baseline stayed ``running`` for good."""
    from sweeper.baseline import job as J

    seen = []

    def fit(*_args, **_kwargs):
        seen.append((dict(_stored(study)), S.claimable(_stored(study), Identity.current())))
        raise ValueError("stop here")

    monkeypatch.setattr(J, "fit_study", fit)
    here = Identity.current()
    with pytest.raises(ValueError):
        J.compute(validate_config(TINY, "tiny"), study, 1, here.host, "d1", tmp_path)
    ((stored, claimable),) = seen
    assert (stored["host"], stored["pid"], stored["pid_ns"]) == (here.host, os.getpid(), here.pid_ns)
    assert claimable is False  # this process lives: its run is not taken (a gone pid's is: the test above)


def test_the_sweep_settles_only_its_own_running_run(study):
    S.claim(study, NullLock(), _who("h1", "d1"))
    assert S.settle(study, State.FAILED, "h2", "d2", "not ours") is False  # another driver's run
    S.mark(study, State.DONE, "h1", "d1")  # the job recorded its end first
    assert S.settle(study, State.FAILED, "h1", "d1", "exited") is False
    assert _stored(study) == {"state": "done", "host": "h1", "driver": "d1", "at": AT}


def test_what_the_sweep_records_after_the_job_exits():
    log = Path("logs/h.baseline.log")
    assert S.after_exit(0, log) is None
    assert S.after_exit(75, log) == (State.INTERRUPTED, f"the study's storage was away; see {log}")
    assert S.after_exit(1, log) == (State.FAILED, f"the baseline job exited with code 1; see {log}")
    assert S.after_exit(-9, log) == (State.FAILED, f"the baseline job exited with code -9; see {log}")


# ------------------------------------------------------------------ the sweep's job and the worker's turn


def _slot(gpu: bool = False) -> Slot:
    g = GPU(index=0, uuid="GPU-a", name="fake", total_mb=4000, free_mb=4000, used_mb=0, util=0) \
        if gpu else None
    return Slot(id=0, kind="gpu" if gpu else "cpu", gpu=g, env={}, threads=1, label="cpu 0")


def _worker(tmp_path) -> WorkerHandle:
    w = WorkerHandle(_slot(), {"driver": {"host": "h1"}}, tmp_path)
    w.ready = True
    return w


def test_a_reserved_worker_is_not_idle_until_released(tmp_path):
    w = _worker(tmp_path)
    assert w.idle and not w.reserved
    w.reserve()
    assert w.reserved and not w.idle
    w.release()
    assert w.idle and not w.reserved


def test_slot_dispatch_honours_the_turn_and_packing_takes_none():
    assert SlotDispatch.honours_turn is True and PackedDispatch.honours_turn is False
    cfg = validate_config(TINY, "tiny")
    packed = validate_config(merge(TINY, {"devices": {"gpus": "auto", "trials_per_gpu": "auto"}}), "tiny")
    assert honours_turn(cfg, _slot()) is True
    assert honours_turn(packed, _slot(gpu=True)) is False
    assert honours_turn(packed, _slot()) is True  # no GPU here: a trial per CPU slot


class _Proc:
    """A stand-in for the job's subprocess: it runs until told its exit code."""

    def __init__(self, cmd, **kw):
        self.cmd, self.env, self.pid, self.returncode = cmd, kw["env"], -1, None
        self.stdin = io.BytesIO()
        self.stdin.close = lambda: None  # the config stays readable here

    def poll(self):
        return self.returncode

    def wait(self):
        self.returncode = -9 if self.returncode is None else self.returncode
        return self.returncode


@pytest.fixture
def job(study, tmp_path, monkeypatch):
    procs = []

    def popen(cmd, **kw):
        procs.append(_Proc(cmd, **kw))
        return procs[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.setattr(launch.os, "killpg", lambda pid, sig: None)  # nothing real to kill
    cfg = validate_config(merge(TINY, {"report": {"baseline": "lightgbm"}}), "tiny")
    out = BaselineJob(cfg, study, NullLock(), Identity(host="h1", pid=1, driver_id="d1"), tmp_path)
    out.procs = procs
    return out


@pytest.mark.parametrize("stored, starts", [(None, True), ("interrupted", True), ("running", False),
                                            ("done", False), ("failed", False)])
def test_the_sweeps_job_follows_the_claim_rule_and_takes_the_turn(job, study, tmp_path, stored, starts):
    if stored is not None:
        S.mark(study, State(stored), "h0", "d0")
    w = _worker(tmp_path)
    job.trial_ended(w)
    job.trial_ended(w)  # once per driver
    assert len(job.procs) == (1 if starts else 0) and job.running is starts
    assert w.reserved is starts and w.idle is not starts
    assert _stored(study)["driver"] == ("d1" if starts else "d0")
    if starts:
        assert json.loads(job.procs[0].stdin.getvalue())["study"]["name"] == "tiny"
        assert job.procs[0].env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("code, after", [
    (0, {"state": "running", "host": "h1", "driver": "d1", "at": AT, "pid": 1, "pid_ns": ""}),  # the job records done
    (75, {"state": "interrupted", "host": "h1", "driver": "d1", "at": AT, "error": "the study's storage "
          "was away; see {log}"}),
    (3, {"state": "failed", "host": "h1", "driver": "d1", "at": AT, "error": "the baseline job exited "
         "with code 3; see {log}"})])
def test_an_exited_job_gives_the_turn_back_and_is_settled(job, study, tmp_path, code, after):
    w = _worker(tmp_path)
    job.trial_ended(w)
    job.poll()
    assert w.reserved and job.running  # still running
    job.procs[0].returncode = code
    job.poll()
    assert w.idle and not job.running
    log = tmp_path / "logs" / "h1.baseline.log"
    assert _stored(study) == {k: v.format(log=log) if k == "error" else v for k, v in after.items()}


def test_a_stopped_job_is_interrupted_and_claimable_again(job, study, tmp_path):
    w = _worker(tmp_path)
    job.trial_ended(w)
    job.stop()
    assert w.idle and not job.running
    assert _stored(study) == {"state": "interrupted", "host": "h1", "driver": "d1", "at": AT,
                              "error": "the sweep stopped before the baseline ended"}
    assert S.claim(study, NullLock(), _who("h2", "d2")) is True


@pytest.mark.parametrize("raised, after", [
    (KeyboardInterrupt(), {"state": "interrupted", "error": "KeyboardInterrupt: "}),  # Ctrl-C of `sweeper baseline`
    (ValueError("bad fold"), {"state": "failed", "error": "ValueError: bad fold"}),
])
def test_a_fit_stopped_by_ctrl_c_is_interrupted_and_claimed_again(study, monkeypatch, tmp_path, raised, after):
    from sweeper.baseline import job as J

    def fit(*_args, **_kwargs):
        raise raised

    monkeypatch.setattr(J, "fit_study", fit)
    with pytest.raises(type(raised)):
        J.compute(validate_config(TINY, "tiny"), study, 1, "h1", "d1", tmp_path)
    assert _stored(study) == {**after, "host": "h1", "driver": "d1", "at": AT}
    # an interrupted fit says nothing about the baseline: the next sweep computes it; a failed one is kept
    assert S.claim(study, NullLock(), _who("h2", "d2")) is (after["state"] == "interrupted")


def test_status_words_for_each_stored_state():
    """An interrupted baseline read "done" in status and best (every state but two did)."""
    from sweeper.baseline.compare import state_words

    stored = {"host": "h1", "at": "2026-12-07T08:00:00", "error": S.STOPPED}
    words = {s: state_words({**stored, "state": s.value}, None) for s in State}
    assert words == {
        State.RUNNING: "running on h1 since 2026-12-07T08:00:00",
        State.DONE: "done",
        State.FAILED: f"failed on h1: {S.STOPPED}",
        State.INTERRUPTED: f"interrupted on h1 ({S.STOPPED}): the next sweep that runs a trial computes it, "
                           "as `sweeper baseline STUDY` does"}
    assert state_words(None, None) == "not computed (`sweeper baseline STUDY` computes it)"
    assert state_words(None, {"val_ic": 0.01}) == "done"
