"""``train.precision: auto`` on a CPU with native bf16: fp32 against bf16 measured on the trial's real
steps, chosen once with the stack size, kept by the host and by the study (sweeper.core.precision,
sweeper.core.stack_size.measure_precision, sweeper.validation.runner.pin_stack_size)."""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import sweeper.core.stack_size as S
from sweeper.core import Member
from sweeper.core.device import HostMemory
from sweeper.core.hooks import NullHook
from sweeper.core.precision import measured_on
from sweeper.study import stacking
from sweeper.validation import runner
from toy_panel import toy_config, toy_panel

CPU = torch.device("cpu")


def test_auto_is_measured_only_on_a_cpu_that_runs_bf16_natively(monkeypatch):
    monkeypatch.delenv("SWEEPER_FAKE_CPU_BF16", raising=False)
    assert measured_on("auto", CPU) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    monkeypatch.setenv("SWEEPER_FAKE_CPU_BF16", "1")
    assert measured_on("auto", CPU)
    assert not measured_on("fp32", CPU) and not measured_on("bf16", CPU)
    assert not measured_on("auto", torch.device("cuda"))  # a GPU's auto is its own rule: no measurement
    monkeypatch.setenv("SWEEPER_FAKE_CPU_BF16", "0")
    assert not measured_on("auto", CPU)


@pytest.mark.parametrize(("fp32", "bf16", "asked", "chosen"), [
    # bf16 9 % faster: under the 10 % margin, fp32 stays (each precision timed twice, the best round kept)
    ([100, 98], [109, 108], [("fp32", 0.0), ("bf16", 110.0), ("fp32", 0.0), ("bf16", 110.0)], "fp32"),
    # bf16 12 % faster in one round: chosen
    ([100, 90], [112, 90], [("fp32", 0.0), ("bf16", 110.0), ("fp32", 0.0), ("bf16", 110.0)], "bf16"),
    # fp32's second round is faster: bf16 must beat that (120 x 1.1 = 132)
    ([100, 120], [125, 130], [("fp32", 0.0), ("bf16", 110.0), ("fp32", 0.0), ("bf16", 132.0)], "fp32"),
])
def test_bf16_is_chosen_only_when_it_trains_the_margin_faster(monkeypatch, fp32, bf16, asked, chosen):
    left = {"fp32": list(fp32), "bf16": list(bf16)}
    seen: list[tuple[str, float]] = []

    def rate(members, device, memory, needed=0.0):
        name = members[0].cfg.train.precision
        seen.append((name, round(needed, 1)))
        return float(left[name].pop(0))
    monkeypatch.setattr(S, "_rate", rate)
    out = S.measure_precision(Member(toy_config(), toy_panel()), CPU, HostMemory())
    assert seen == asked
    assert out == {"precision": chosen, "precision_rates": {"fp32": float(max(fp32)), "bf16": float(max(bf16))}}


def test_the_precisions_are_timed_on_real_steps():
    lines: list[str] = []
    out = S.measure_precision(Member(toy_config(epochs=1), toy_panel()), CPU, HostMemory(), lines.append)
    rates = out["precision_rates"]
    assert set(rates) == {"fp32", "bf16"} and all(r > 0 for r in rates.values())
    assert out["precision"] == ("bf16" if rates["bf16"] >= rates["fp32"] * 1.1 else "fp32")
    assert lines == [f"precision {out['precision']}: samples/s fp32 {rates['fp32']:.0f}, "
                     f"bf16 {rates['bf16']:.0f} (measured)"]


def _trainer(tmp_path, **train):
    cfg = toy_config(epochs=1, **train)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"cache_dir": str(tmp_path)})})
    return runner.Trainer(cfg, NullHook(), time.monotonic(), CPU)


def test_a_trial_of_one_run_measures_its_precision_pins_it_and_the_host_keeps_it(monkeypatch, tmp_path):
    """One run and nothing to stack: auto is still measured, the trainer trains in the precision chosen,
    and the next run of the shape on this host reads it back without timing a step."""
    monkeypatch.setenv("SWEEPER_FAKE_CPU_BF16", "1")
    timed: list[str] = []

    def rate(members, *args, **kwargs):
        timed.append(members[0].cfg.train.precision)
        return {"fp32": 100.0, "bf16": 150.0}[timed[-1]]
    monkeypatch.setattr(S, "_rate", rate)
    panel = toy_panel()
    trainer, choice = runner.pin_stack_size(panel, _trainer(tmp_path))
    assert choice == {"stack_size": 1, "stack_size_from": "one run per trial", "precision": "bf16",
                      "precision_rates": {"fp32": 100.0, "bf16": 150.0}}
    assert trainer.cfg.train.precision == "bf16" and trainer.cfg.train.max_stack == 1
    assert timed == ["fp32", "bf16", "fp32", "bf16"]
    again, kept = runner.pin_stack_size(panel, _trainer(tmp_path))
    assert kept == choice and again.cfg.train.precision == "bf16" and len(timed) == 4  # nothing timed
    # a number in train.precision is the user's: nothing is measured
    fixed, pinned = runner.pin_stack_size(panel, _trainer(tmp_path, precision="fp32"))
    assert fixed.cfg.train.precision == "fp32" and "precision" not in pinned and len(timed) == 4


def test_the_stack_sizes_are_timed_in_the_precision_chosen(monkeypatch, tmp_path):
    monkeypatch.setenv("SWEEPER_FAKE_CPU_BF16", "1")
    timed: list[tuple[int, str]] = []

    def rate(members, *args, **kwargs):
        timed.append((len(members), members[0].cfg.train.precision))
        return {"fp32": 100.0, "bf16": 50.0}[members[0].cfg.train.precision] * len(members)
    monkeypatch.setattr(S, "_rate", rate)
    trainer = _trainer(tmp_path)
    repeats = trainer.cfg.validation.model_copy(update={"repeats": 2})
    trainer = dataclasses.replace(trainer, cfg=trainer.cfg.model_copy(update={"validation": repeats}))
    pinned, choice = runner.pin_stack_size(toy_panel(), trainer)
    assert timed == [(1, "fp32"), (1, "bf16"), (1, "fp32"), (1, "bf16"), (1, "fp32"), (2, "fp32")]
    assert choice["precision"] == "fp32" and choice["stack_size"] == 2
    assert pinned.cfg.train.precision == "fp32" and pinned.cfg.train.max_stack == 2


def test_the_study_keeps_the_precision_with_the_stack_size_and_an_older_study_keeps_fp32():
    measured = {"stack_size": 1, "stack_size_from": "one run per trial", "precision": "bf16",
                "precision_rates": {"fp32": 100.0, "bf16": 150.0}}
    assert stacking.decided({stacking.STUDY_ATTR: measured}, "auto") == {**measured,
                                                                         "stack_size_from": "study"}
    # a study whose trials trained before auto was measured: no precision stored, so auto stays fp32
    older = stacking.decided({stacking.STUDY_ATTR: {"stack_size": 2, "stack_size_from": "measured"}}, "auto")
    assert older == {"stack_size": 2, "stack_size_from": "study"}


@pytest.mark.slow
def test_a_sweep_measures_its_precision_once_and_every_trial_trains_in_it(study_file):
    """A sweep on a CPU taken for one with native bf16: the first trial measures, the study keeps
    the choice with its stack size, and every trial trains in it and says so (its attributes, its
    config.yaml, ``sweeper best``)."""
    import json

    import optuna
    import yaml

    from conftest import sweeper_cli

    path = study_file({"study": {"n_trials": 2}, "devices": {"cpu_workers": 1}})
    raw = yaml.safe_load(path.read_text())
    raw["data"]["cache_dir"] = str(path.parent / "host-cache")  # this test's own: nothing measured before
    path.write_text(yaml.safe_dump(raw))
    sweeper_cli(path.parent, "run", path.name, env={"SWEEPER_FAKE_CPU_BF16": "1"})
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{path.parent / 'runs/tiny/study.db'}")
    stored = study.user_attrs[stacking.STUDY_ATTR]
    chosen, rates = stored["precision"], stored["precision_rates"]
    assert chosen == ("bf16" if rates["bf16"] >= rates["fp32"] * 1.1 else "fp32")
    for trial in study.trials:
        assert trial.user_attrs["precision"] == chosen and trial.user_attrs["precision_rates"] == rates
        config = yaml.safe_load((path.parent / f"runs/tiny/trials/{trial.number}/config.yaml").read_text())
        assert config["train"]["precision"] == chosen
    best = json.loads(sweeper_cli(path.parent, "best", path.name, "--json").stdout)
    assert best["metrics"]["precision"] == chosen and best["precision_rates"] == rates
    shown = f"precision {chosen} (samples/s fp32 {rates['fp32']:.0f}, bf16 {rates['bf16']:.0f})"
    assert shown in sweeper_cli(path.parent, "best", path.name).stdout
