from __future__ import annotations

import sqlite3
import sys
import types

import optuna
import pytest
import torch

from sweeper.devices import GPU, NvmlProbe, list_gpus
from sweeper.inspect import doctor as doctor_module
from sweeper.inspect.doctor import NO_GPU_VERDICT, doctor


def h100(index: int, processes: list[dict] | None = None) -> GPU:
    return GPU(index, f"GPU-{index:04d}", "NVIDIA H100 80GB HBM3", 81559, 80000, 1559, 12,
               processes or [], True, (9, 0))


@pytest.fixture
def no_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    monkeypatch.delenv("SWEEPER_FAKE_BUSY", raising=False)


@pytest.mark.skipif(bool(list_gpus()), reason="this machine has GPUs")
def test_doctor_on_this_machine(no_fakes) -> None:
    report = doctor()
    assert report.exit_code == 0
    assert report.verdict == "no GPU: CPU slots will be used"
    rows = dict(report.rows)
    assert rows["torch"] == torch.__version__
    assert rows["optuna"] == optuna.__version__
    assert rows["SQLite"] == sqlite3.sqlite_version
    assert rows["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")
    assert rows["torch.cuda.is_available()"] == "False"
    assert not any(check.startswith("GPU ") for check in rows)
    assert report.rows[-1][0] == "torch.cuda.is_available()"  # asked only after NVML


def test_doctor_without_driver(no_fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def fail() -> None:
        raise NVMLError("Driver Not Loaded")

    nvml.NVMLError, nvml.nvmlInit = NVMLError, fail
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    code, verdict = doctor()[2], doctor()[1]  # also a plain tuple
    assert (code, verdict) == (0, NO_GPU_VERDICT)
    assert dict(doctor().rows)["NVIDIA driver"] == "not found: NVML unavailable (Driver Not Loaded): no NVIDIA driver?"


def test_doctor_lists_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "2")
    monkeypatch.setenv("SWEEPER_FAKE_BUSY", "1")
    rows, verdict, code = doctor()
    checks = dict(rows)
    assert [c for c, _ in rows if c.startswith("GPU ") and " " not in c[4:]] == ["GPU 0", "GPU 1"]
    assert checks["GPU 0"] == "Fake GPU GPU-00000000-0000-4000-8000-000000000000"
    assert checks["GPU 1 memory"] == "51920 MB free of 81920 MB (30000 MB used)"
    assert checks["GPU 1 utilisation"] == "100%" and checks["GPU 1 processes"] == "pid 999999 (30000 MB)"
    assert checks["GPU 0 processes"] == "none" and checks["GPU 0 bf16"] == "yes (compute capability 9.0)"
    assert checks["NVIDIA driver"] == "fake GPUs (SWEEPER_FAKE_GPUS=2)"
    assert (verdict, code) == ("2 GPUs faked by SWEEPER_FAKE_GPUS: GPU slots will train on the CPU", 0)


@pytest.mark.parametrize(
    "cuda,available,verdict,code",
    [
        (None, False, "2 GPUs found but this torch is a CPU-only build: install a CUDA build of torch", 1),
        ("12.4", False, "2 GPUs found but torch.cuda.is_available() is False: the driver (550.54.15) "
                        "may be too old for torch's CUDA 12.4", 1),
        ("12.4", True, "ok: 2 GPUs ready for GPU slots (1 in use by other processes: GPU 1)", 0),
    ],
)
def test_verdict_with_real_gpus(monkeypatch: pytest.MonkeyPatch, cuda, available, verdict, code) -> None:
    gpus = [h100(0), h100(1, [{"pid": 7, "used_mb": None}])]
    monkeypatch.setattr(doctor_module, "probe", lambda: NvmlProbe(gpus, driver="550.54.15"))
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    report = doctor()
    assert (report.verdict, report.exit_code) == (verdict, code)
    rows = dict(report.rows)
    assert rows["NVIDIA driver"] == "550.54.15" and rows["GPU 1 processes"] == "pid 7"
    assert rows["torch CUDA build"] == (cuda or "none (CPU-only build)")
