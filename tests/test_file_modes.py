"""Files sweeper writes atomically take the mode the umask gives, as a plain open() would
(not mkstemp's 0600): a colleague on shared storage can read a report or the weights."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.atomic import current_umask, write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _sweeper(umask: int, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "sweeper.cli", *args], capture_output=True, text=True,
                          timeout=600, umask=umask)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_a_sweep_report_and_export_take_the_umask(study_file, workdir, umask, mode):
    path = str(study_file({"study": {"n_trials": 1}, "devices": {"cpu_workers": 1}}))
    _sweeper(umask, "run", path)
    _sweeper(umask, "report", path, "-o", "report.html")
    _sweeper(umask, "export", path, "-o", "trials.csv")
    written = {name: _mode(workdir / name) for name in (
        "runs/tiny/trials/0/weights.pt", "report.html", "trials.csv")}
    assert written == dict.fromkeys(written, mode)


def test_current_umask_reads_without_changing_it(tmp_path):
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert current_umask() == 0o027  # reading it left it as it was
        write_text(tmp_path / "a.txt", "x")
        assert _mode(tmp_path / "a.txt") == 0o640
    finally:
        os.umask(old)


def test_the_fallback_without_proc(tmp_path, monkeypatch):
    # where /proc/self/status cannot be read (not Linux), the umask is set and reset
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: (_ for _ in ()).throw(OSError("no /proc"))
                        if str(self) == "/proc/self/status" else real(self, *a, **k))
    old = os.umask(0o002)
    try:
        assert current_umask() == 0o002
        assert os.umask(0o002) == 0o002  # left as it was
    finally:
        os.umask(old)
