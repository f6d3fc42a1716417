"""A full disk (ENOSPC/EDQUOT): the trial fails as ``disk``, the sweep stops with exit 1 and
one line naming the folder, and a later ``sweeper run`` finishes the study once space is free.

The disk is real: a tmpfs of a few MB that the tests mount (root; where mounting is
impossible they skip, or fail where SWEEPER_REQUIRE_SERVICES=1 as in CI), filled with a
ballast file so that the next big write (a checkpoint) overflows it.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState, create_trial

from conftest import sweeper_cli
from sweeper.atomic import as_disk_full, atomic_path, disk_full, write_text
from sweeper.config import load_config
from sweeper.dispatch.stopping import Ending, StopRule, TrialEnd
from sweeper.errors import DiskFull, FailReason
from sweeper.interrupt import StopToken
from sweeper.study.retry_rule import MAX_INTERRUPTED_RETRIES, retry_plan

MB = 1 << 20


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SWEEPER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} [SWEEPER_REQUIRE_SERVICES=1]", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MB tmpfs mounted for the test, unmounted after it (lazily if it is busy)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        _skip_or_fail(f"cannot mount a tmpfs for the full-disk test: {exc}")
    if mounted.returncode != 0:
        _skip_or_fail(f"cannot mount a tmpfs for the full-disk test (needs root): {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(mnt: Path, leave: int) -> Path:
    """A ballast file that leaves about ``leave`` bytes free on ``mnt``."""
    ballast = mnt / "ballast"
    with ballast.open("wb") as fh:
        fh.write(b"\0" * max(_free(mnt) - leave, 0))
    return ballast


# ---------------------------------------------------------------- the write boundary

@pytest.mark.slow
def test_a_torch_save_that_overflows_is_disk_full_and_leaves_the_old_file(small_fs):
    target = small_fs / "trials" / "0" / "checkpoint.pt"
    target.parent.mkdir(parents=True)
    torch.save({"w": torch.zeros(10)}, target)
    old = target.read_bytes()
    _fill(small_fs, 256 * 1024)
    with pytest.raises(DiskFull) as caught, atomic_path(target) as tmp:
        torch.save({"w": torch.zeros(MB)}, tmp)  # 4 MB into 256 KB (a bare RuntimeError from C++)
    assert str(caught.value) == f"no space left on device writing {target} (ENOSPC)"
    assert caught.value.errno == errno.ENOSPC and caught.value.reason == FailReason.DISK
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint.pt"]  # no temporary file left
    assert target.read_bytes() == old


@pytest.mark.slow
def test_a_text_write_that_overflows_is_disk_full(small_fs):
    target = small_fs / "report.html"
    write_text(target, "old")
    _fill(small_fs, 64 * 1024)
    with pytest.raises(DiskFull, match=f"^no space left on device writing {target} \\(ENOSPC\\)$"):
        write_text(target, "x" * (2 * MB))
    assert sorted(p.name for p in small_fs.iterdir()) == ["ballast", "report.html"]
    assert target.read_text() == "old"


def test_the_rule_for_writes_that_are_not_atomic(tmp_path):
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(enospc) and disk_full(DiskFull("x"))
    try:  # the errno may sit on the cause/context chain (torch.save into an open file)
        try:
            raise enospc
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598")  # noqa: B904 - the implicit context is the point
    except RuntimeError as wrapped:
        assert disk_full(wrapped)
    quota = as_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path / "metrics.csv")
    assert str(quota) == f"disk quota exceeded writing {tmp_path / 'metrics.csv'} (EDQUOT)"
    assert quota.errno == errno.EDQUOT and quota.__cause__.errno == errno.EDQUOT
    # a RuntimeError is a full disk only where the file system has (almost) no space
    assert not disk_full(RuntimeError("unexpected pos"), tmp_path / "x.pt")
    assert not disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path / "x.pt")
    assert as_disk_full(ValueError("no"), tmp_path) is None


# ---------------------------------------------------------------- the sweep's side

def test_a_disk_failure_stops_the_sweep_with_one_line(study_file):
    cfg = load_config(study_file())
    rule = StopRule(cfg.study, StopToken(), Path("/data/runs/tiny"))
    error = "no space left on device writing /data/runs/tiny/trials/3/checkpoint.pt (ENOSPC)"
    rule.trial_ended(TrialEnd(3, TrialState.FAIL, reason="disk", metrics={"fail_reason": "disk", "error": error},
                              reported=True))
    assert rule.stopping() and rule.ending() is Ending.FAILED
    assert rule.message == (f"stopped: trial 3 failed as disk: {error}; free space under /data/runs/tiny "
                            "and run `sweeper run` again to resume")


def test_a_disk_failure_is_retried_from_its_checkpoint(study_file):
    cfg = load_config(study_file())
    source = "runs/tiny/trials/1/checkpoint.pt"  # an earlier attempt's (this one saved none)
    t = create_trial(state=TrialState.FAIL, params={}, distributions={},
                     user_attrs={"fail_reason": "disk", "attempt": 2, "resume_from": source})
    t.number = 4
    [(failed, attrs)] = retry_plan([t], cfg.study, Path("runs/tiny"))
    assert failed.number == 4
    # the retry names the trial it resumes, read here from the older retry's path
    assert attrs == {"retry_of": 4, "attempt": 3, "crash_count": 0, "resume_from_trial": 1}
    Path("runs/tiny/trials/4").mkdir(parents=True)
    Path("runs/tiny/trials/4/checkpoint.pt").write_bytes(b"x")  # it saved one after all: its own
    assert retry_plan([t], cfg.study, Path("runs/tiny"))[0][1]["resume_from_trial"] == 4
    t.user_attrs["attempt"] = MAX_INTERRUPTED_RETRIES
    assert retry_plan([t], cfg.study, Path("runs/tiny")) == []


# ---------------------------------------------------------------- end to end

def _sweep(path: Path, *args: str) -> Any:
    """``sweeper run`` in this process (what to do on a full disk is the driver's decision; its
    workers are real processes): the click Result, ``exit_code`` and ``output``."""
    return sweeper_cli(Path.cwd(), "run", str(path), *args, code=None)


@pytest.mark.slow
def test_a_sweep_on_a_full_disk_stops_and_resumes_once_space_is_freed(study_file, workdir, small_fs):
    run_folder = small_fs / "run"
    db = workdir / "study.db"  # the study's records live off the full disk
    # hidden_size 8000: a checkpoint (model, best weights and AdamW's moments) of about 2 MB; the
    # space left takes epoch 1's, but not epoch 2's beside it (an atomic write needs both)
    path = study_file({"study": {"n_trials": 3, "artifacts": str(run_folder), "storage": f"sqlite:///{db}"},
                       "model": {"hidden_size": 8000}, "devices": {"cpu_workers": 1}})
    ballast = _fill(small_fs, 3 * MB)
    first = _sweep(path)
    out = first.output
    assert first.exit_code == 1, out
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    [trial] = study.get_trials()
    assert trial.state == TrialState.FAIL and trial.user_attrs["fail_reason"] == "disk", trial.user_attrs
    written = run_folder / "trials" / "0" / "checkpoint.pt"
    assert trial.user_attrs["error"] == f"no space left on device writing {written} (ENOSPC)"
    lines = [line.partition("] ")[2] for line in out.splitlines() if "free space under" in line]
    assert lines == [f"stopped: trial 0 failed as disk: no space left on device writing {written} (ENOSPC); "
                     f"free space under {run_folder} and run `sweeper run` again to resume"], out

    ballast.unlink()
    second = _sweep(path)
    assert second.exit_code == 0, second.output
    trials = study.get_trials()
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 3
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    [retry] = [t for t in trials if t.user_attrs.get("retry_of") == 0]
    assert retry.state == TrialState.COMPLETE
    # it went on from the last checkpoint that was written whole (epoch 1), not the broken write
    assert (retry.user_attrs["resume_from_trial"], retry.user_attrs["resumed_from_epoch"]) == (0, 1)
    for ckpt in run_folder.rglob("checkpoint.pt"):
        assert int(torch.load(ckpt, weights_only=True)["epoch"]) >= 1
    assert not list(run_folder.rglob("*.tmp"))


@pytest.mark.slow
def test_a_disk_full_before_any_write_fails_the_trial_as_disk(study_file, workdir, small_fs):
    # not one byte left: the first write to fail is a plain one (config.yaml, train.log, metrics.csv)
    run_folder = small_fs / "run"
    db = workdir / "study.db"
    path = study_file({"study": {"n_trials": 1, "artifacts": str(run_folder), "storage": f"sqlite:///{db}"},
                       "devices": {"cpu_workers": 1}})
    assert _sweep(path).exit_code == 0  # the run folder is set up (owner.json, logs/) while there is room
    ballast = _fill(small_fs, 0)
    first = _sweep(path, "--set", "study.n_trials=2")
    out = first.output
    assert first.exit_code == 1, out
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    trial = study.get_trials()[1]
    assert (trial.state, trial.user_attrs.get("fail_reason")) == (TrialState.FAIL, "disk"), out
    assert trial.user_attrs["error"].startswith("no space left on device writing "), trial.user_attrs
    assert len([line for line in out.splitlines() if f"free space under {run_folder} " in line]) == 1, out
    assert not study.get_trials(states=(TrialState.RUNNING,))
    ballast.unlink()
    second = _sweep(path, "--set", "study.n_trials=2")
    assert second.exit_code == 0, second.output
    trials = study.get_trials()
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2
    assert not [t for t in trials if t.state == TrialState.RUNNING]
