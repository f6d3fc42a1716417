"""precision: auto picks bf16 only where the GPU runs it natively, else fp16 with a GradScaler.
CUDA's answers are stood in for, so this runs on a CPU; the choice is the code under test."""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from sweeper.core.precision import native_bf16, resolve_precision
from sweeper.errors import ConfigError

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """A stand-in GPU of a given compute capability, on a torch with or without including_emulation."""
    def make(major: int, emulates: bool = True, old_torch: bool = False) -> list[dict]:
        calls: list[dict] = []

        def is_bf16_supported(**kwargs):
            calls.append(kwargs)
            if old_torch and kwargs:
                raise TypeError("is_bf16_supported() got an unexpected keyword argument 'including_emulation'")
            return major >= 8 or (emulates and kwargs.get("including_emulation", True))
        monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
        return calls
    return make


@pytest.mark.parametrize("major, old_torch, expected", [
    (9, False, "bf16"),   # H100 / H200
    (8, False, "bf16"),   # A100, 4090
    (7, False, "fp16"),   # V100, T4: bf16 is only emulated there
    (6, False, "fp16"),
    (8, True, "bf16"),    # a torch without including_emulation: compute capability decides
    (7, True, "fp16"),
])
def test_auto_is_bf16_only_where_native(gpu, major, old_torch, expected):
    calls = gpu(major, old_torch=old_torch)
    precision = resolve_precision("auto", CUDA)
    assert (precision.name, precision.device_type) == (expected, "cuda")
    assert calls[0] == {"including_emulation": False}
    assert native_bf16(CUDA) is (expected == "bf16")


def test_the_emulated_answer_is_not_taken(gpu):
    gpu(7, emulates=True)
    assert torch.cuda.is_bf16_supported() is True  # what the old check saw on a V100
    assert resolve_precision("auto", CUDA).name == "fp16"


def test_explicit_choices_and_refusals_on_the_cpu():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).name == "fp32"
    assert resolve_precision("bf16", cpu).dtype is torch.bfloat16
    with pytest.raises(ConfigError, match="train.precision: fp16 needs a CUDA device"):
        resolve_precision("fp16", cpu)


@pytest.mark.parametrize("precision, choices, said", [
    ("auto", ["bf16", "fp16"], "search_space.train.precision: fp16 needs a CUDA device (training on the CPU: "
                               "cpu0); use bf16, fp32 or auto"),  # each fp16 draw was pruned
    ("fp16", ["fp32", "bf16"], None),  # no trial trains at the file's own fp16: nothing to refuse
    ("fp16", None, "train.precision: fp16 needs a CUDA device (training on the CPU: cpu0); use bf16, fp32 or auto"),
])
def test_validate_refuses_fp16_that_a_trial_would_train_at_on_a_host_of_cpus(tmp_path, monkeypatch, precision,
                                                                             choices, said):
    import yaml
    from click.testing import CliRunner

    from sweeper.cli import main

    monkeypatch.chdir(tmp_path)
    space = {"train.precision": {"type": "categorical", "choices": choices}} if choices else {}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "data": {"synthetic": {"assets": 20, "dates": 200, "features": 3}}, "train": {"precision": precision},
        "devices": {"gpus": "none", "cpu_workers": 1}, "search_space": space}))
    done = CliRunner().invoke(main, ["validate", "s.yaml"], catch_exceptions=False)
    assert (done.exit_code, done.output.strip() if said else done.output.splitlines()[0]) == (
        (2, f"Error: {said}") if said else (0, "s.yaml: ok"))
