"""The sweep driver end to end: real worker processes, a real SQLite store."""
from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from conftest import PROBE
from sweeper.config import load_config
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import run
from sweeper.inspect.results import status_report

pytestmark = pytest.mark.slow  # every test here starts a real process

FAKE_UUIDS = [f"GPU-00000000-0000-4000-8000-00000000000{k}" for k in range(4)]


class Ends(NullView):
    def __init__(self):
        self.reasons: dict[int, str | None] = {}

    def trial_ended(self, slot, number, state, value, reason):
        self.reasons[number] = reason


def _sweep(path, view=None, **kw):
    cfg = load_config(path)
    outcome = run(cfg, view=view or NullView(), **kw)
    study = optuna.load_study(study_name=cfg.study.name, storage=cfg.study.resolved_storage)
    return outcome, study


def _enqueue(cfg_path, params_list):
    cfg = load_config(cfg_path)
    from sweeper.store import open_storage

    study = optuna.create_study(study_name=cfg.study.name, storage=open_storage(cfg.study.resolved_storage),
                                direction="maximize", load_if_exists=True)
    for params in params_list:
        study.enqueue_trial(params)


def _finished(study):
    return study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))


def test_fake_gpus_one_gpu_per_worker_and_no_overlap(study_file, monkeypatch):
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "2")
    path = study_file({"study": {"n_trials": 6}, "devices": {"gpus": "auto", "trials_per_gpu": 1}})
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0
    trials = study.get_trials()
    assert len(_finished(study)) == 6 and len(trials) == 6
    by_gpu: dict[str, list] = {}
    for t in trials:
        visible = t.user_attrs["cuda_visible_devices"]
        assert visible in FAKE_UUIDS[:2], visible  # exactly one GPU, by UUID
        assert "," not in visible
        by_gpu.setdefault(visible, []).append((t.datetime_start, t.datetime_complete))
    assert len(by_gpu) == 2
    for spans in by_gpu.values():
        spans.sort()
        for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
            assert e0 <= s1, "two trials overlapped on one GPU"


def test_busy_gpu_is_skipped(study_file, monkeypatch):
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "3")
    monkeypatch.setenv("SWEEPER_FAKE_BUSY", "1")
    path = study_file({"study": {"n_trials": 4}, "devices": {"gpus": "auto", "skip_busy": True}})
    _, study = _sweep(path)
    used = {t.user_attrs["cuda_visible_devices"] for t in study.get_trials()}
    assert used == {FAKE_UUIDS[0], FAKE_UUIDS[2]}


def test_failing_trials_cost_only_themselves(study_file, monkeypatch):
    monkeypatch.setenv("SWEEPER_FAKE_TIMEOUT_GRACE_S", "1")  # the hang is killed 1.8 s after max_minutes, not 2 min
    path = study_file({
        "study": {"n_trials": 2, "retries": 0},
        "train": {"max_minutes": 0.08},
        "model": PROBE,
        "devices": {"cpu_workers": 2},
        "search_space": {"model.kind": {"type": "categorical", "choices": ["mlp", "raise", "exit", "hang"]}},
    })
    _enqueue(path, [{"model.kind": k} for k in ("raise", "exit", "hang", "mlp", "mlp")])
    lines = Ends()
    outcome, study = _sweep(path, view=lines)
    assert outcome.exit_code == 0
    # each failure's cause on its line of the run's output (it was only "(crash)"), and in status
    assert {k: lines.reasons[k] for k in range(3)} == {0: "crash: RuntimeError: boom: a bug in the user's model",
                                                       1: "crash: worker exited with code 3",
                                                       2: "timeout: trial exceeded train.max_minutes=0.08 by more "
                                                          "than its 1 s grace for scoring and writing results"}
    report = status_report(study, load_config(path))
    assert report["last_failure"] == {"number": 2, "error": lines.reasons[2].removeprefix("timeout: ")}
    reasons = {t.params["model.kind"]: t.user_attrs.get("fail_reason")
               for t in study.get_trials(states=(TrialState.FAIL,))}
    assert reasons == {"raise": "crash", "exit": "crash", "hang": "timeout"}
    assert "boom" in next(t for t in study.get_trials() if t.params["model.kind"] == "raise").user_attrs["error"]
    assert [t.params["model.kind"] for t in _finished(study)] == ["mlp", "mlp"]
    assert not study.get_trials(states=(TrialState.RUNNING,))


def test_pruning_across_processes(study_file):
    path = study_file({
        "study": {"n_trials": 4, "pruner": {"name": "median", "options": {"n_startup_trials": 2, "n_warmup_steps": 0}}},
        "train": {"epochs": 3},
        "model": PROBE,
        "devices": {"cpu_workers": 1},
        "search_space": {"model.kind": {"type": "categorical", "choices": ["mlp", "noise"]}},
    })
    _enqueue(path, [{"model.kind": k} for k in ("mlp", "mlp", "noise", "noise")])
    _, study = _sweep(path)
    states = [(t.params["model.kind"], t.state) for t in study.get_trials()]
    assert states[:2] == [("mlp", TrialState.COMPLETE)] * 2
    assert states[2:] == [("noise", TrialState.PRUNED)] * 2
    pruned = study.get_trials(states=(TrialState.PRUNED,))
    assert all(len(t.intermediate_values) < 3 for t in pruned)
    assert [t.user_attrs["stop_reason"] for t in study.get_trials()] == ["epochs", "epochs", "pruned", "pruned"]


def test_n_trials_counts_finished_trials_across_runs(study_file):
    path = study_file({"study": {"n_trials": 3}})
    _, study = _sweep(path)
    assert len(_finished(study)) == 3
    _, study = _sweep(path)
    assert len(study.get_trials()) == 3  # already at budget: nothing new
    path = study_file({"study": {"n_trials": 5}})
    _, study = _sweep(path)
    assert len(_finished(study)) == 5 and len(study.get_trials()) == 5


def test_stored_attributes(study_file):
    path = study_file({"study": {"n_trials": 1}})
    _, study = _sweep(path)
    attrs = study.user_attrs
    assert attrs["config"]["model"]["name"] == "mlp"
    assert len(attrs["config_hash"]) == 16 and attrs["sweeper_version"]
    assert attrs["model_fingerprint"] is None  # a built-in model's code is sweeper's, by its version
    assert "torch" in attrs["environment"]
    t = study.get_trials()[0]
    for key in ("val_ic", "val_rank_ic", "val_icir", "val_loss", "test_ic", "test_rank_ic", "test_icir",
                "best_epoch", "epochs_run", "batch_size", "micro_batch_size", "accum_steps", "precision",
                "samples_per_s", "peak_mem_mb", "duration_s", "device", "cuda_visible_devices", "host", "pid"):
        assert key in t.user_attrs, key
    assert sorted(t.intermediate_values) == list(range(1, len(t.intermediate_values) + 1))
    assert t.user_attrs["stop_reason"] == "epochs"
    run = f"runs/tiny/trials/{t.number}"
    import os

    for name in ("config.yaml", "metrics.csv", "train.log", "weights.pt", "daily_ic_valid.csv", "daily_ic_test.csv"):
        assert os.path.exists(f"{run}/{name}"), name
    assert t.value == pytest.approx(t.user_attrs["val_ic"])


def test_eight_workers_one_sqlite_file_no_storage_errors(study_file):
    path = study_file({"study": {"n_trials": 16, "heartbeat_interval": 1}, "devices": {"cpu_workers": 8},
                       "train": {"epochs": 3}})
    outcome, study = _sweep(path)
    assert outcome.exit_code == 0
    assert len(_finished(study)) == 16
    assert not study.get_trials(states=(TrialState.FAIL,))
    import glob

    logs = "".join(open(p).read() for p in glob.glob("runs/tiny/logs/*.log"))
    for bad in ("database is locked", "StorageInternalError", "OperationalError", "Traceback"):
        assert bad not in logs
    assert len({t.user_attrs["slot"] for t in study.get_trials()}) >= 4
