"""Packing trials on a GPU by measured memory (``devices.trials_per_gpu: auto``): the arithmetic's
exact decisions, the driver's packer state, and real sweeps on fake GPUs whose trials report a
set peak (SWEEPER_FAKE_GPU_MEMORY_MB, SWEEPER_FAKE_TRIAL_MEMORY_MB)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from conftest import sweeper_cli
from overlap import most_at_once
from sweeper.config import DevicesConfig, load_config
from sweeper.devices import list_gpus
from sweeper.devices.room import (
    HEADROOM,
    Policy,
    Room,
    admits,
    allotment_mb,
    charge_mb,
    choose,
    free_mb,
    others_mb,
    shape_key,
    suits,
)
from sweeper.dispatch.packer import Held, Packer, first_per_gpu, workers_by_gpu
from sweeper.errors import ConfigError
from sweeper.inspect.figures_base import StudyData
from sweeper.inspect.figures_devices import timeline_figure
from sweeper.store import open_storage

POLICY = Policy(margin=0.1, max_trials=8, max_util=None)


# ------------------------------------------------------------------ the arithmetic


def test_a_trial_is_charged_its_allotment_until_it_has_measured_its_peak():
    assert charge_mb(1500.0, None) == 1500.0
    assert charge_mb(1500.0, 1200.0) == 1200.0
    assert charge_mb(1500.0, 2000.0) == 2000.0  # a trial that outgrows its allotment counts for what it uses


def test_free_memory_is_the_budget_less_our_charges_and_what_others_hold():
    # 4000 MB, 10 % margin: 3600 MB budget; NVML sees 1500 MB used, 1200 of them our one trial
    room = Room(total_mb=4000, used_mb=1500, charges=(1200.0,))
    assert others_mb(room) == 300.0
    assert free_mb(room, 0.1) == 3600 - 300 - 1200
    # a trial just started allocates nothing yet: its charge stands, others never go below 0
    fresh = Room(total_mb=4000, used_mb=100, charges=(1500.0,))
    assert others_mb(fresh) == 0.0 and free_mb(fresh, 0.1) == 2100.0
    assert free_mb(Room(total_mb=4000, used_mb=3900), 0.1) == -300.0


def test_1200_mb_trials_fit_three_on_4000_mb():
    charges: tuple[float, ...] = ()
    for expected in (True, True, True, False):
        room = Room(total_mb=4000, used_mb=0, charges=charges)
        assert admits(room, 1200.0, POLICY) is expected, charges
        charges += (1200.0,)
    # 3600 - 2 x 1200 leaves exactly 1200: the third fits, and is given no more than that
    assert allotment_mb(Room(total_mb=4000, used_mb=0, charges=(1200.0, 1200.0)), 1200.0, POLICY) == 1200.0
    assert allotment_mb(Room(total_mb=4000, used_mb=0, charges=(1200.0,)), 1200.0, POLICY) == HEADROOM * 1200.0


def test_3000_mb_trials_run_one_at_a_time_on_4000_mb():
    assert admits(Room(total_mb=4000, used_mb=0), 3000.0, POLICY)
    assert not admits(Room(total_mb=4000, used_mb=0, charges=(3000.0,)), 3000.0, POLICY)
    assert allotment_mb(Room(total_mb=4000, used_mb=0), 3000.0, POLICY) == 3600.0  # alone: all of it
    assert allotment_mb(Room(total_mb=4000, used_mb=0), 500.0, POLICY) == 3600.0


def test_a_shape_never_measured_starts_only_on_a_gpu_of_its_own_and_gets_all_of_it():
    empty, shared = Room(total_mb=4000, used_mb=0), Room(total_mb=4000, used_mb=0, charges=(100.0,))
    assert admits(empty, None, POLICY) and not admits(shared, None, POLICY)
    assert allotment_mb(empty, None, POLICY) == 3600.0
    # before it has measured, it is charged all of it: nothing else starts beside it
    assert not admits(Room(total_mb=4000, used_mb=0, charges=(charge_mb(3600.0, None),)), 10.0, POLICY)


def test_an_exclusive_trial_neither_joins_nor_is_joined():
    empty, shared = Room(total_mb=4000, used_mb=0), Room(total_mb=4000, used_mb=0, charges=(100.0,))
    assert admits(empty, 100.0, POLICY, exclusive=True)
    assert not admits(shared, 100.0, POLICY, exclusive=True)
    assert not admits(Room(total_mb=4000, used_mb=0, charges=(100.0,), exclusive=True), 100.0, POLICY)


def test_max_trials_and_max_util_stop_adding_but_an_idle_gpu_always_takes_one():
    capped = Policy(margin=0.1, max_trials=2, max_util=80)
    assert not admits(Room(total_mb=80000, used_mb=0, charges=(100.0, 100.0)), 100.0, capped)
    assert admits(Room(total_mb=80000, used_mb=0, util=79, charges=(100.0,)), 100.0, capped)
    assert not admits(Room(total_mb=80000, used_mb=0, util=80, charges=(100.0,)), 100.0, capped)
    assert admits(Room(total_mb=80000, used_mb=0, util=None, charges=(100.0,)), 100.0, capped)  # NVML can't say
    # a saturated GPU, or one others fill, still takes a trial when none of ours runs there
    assert admits(Room(total_mb=4000, used_mb=3900, util=100), 3000.0, capped)
    assert allotment_mb(Room(total_mb=4000, used_mb=3900, util=100), 3000.0, capped) == 0.0


def test_choose_spreads_over_gpus_before_packing_then_takes_the_most_free():
    rooms = {"a": Room(4000, 0, charges=(1000.0,)), "b": Room(4000, 0), "c": Room(8000, 0, charges=(1000.0,))}
    assert choose(rooms, 1000.0, POLICY) == "b"
    del rooms["b"]
    assert choose(rooms, 1000.0, POLICY) == "c"
    assert choose(rooms, 7000.0, POLICY) is None
    assert choose({}, 1000.0, POLICY) is None


def test_a_gpu_others_fill_takes_no_trial_it_cannot_suit_while_another_gpu_can():
    """An idle GPU always took one: one where a colleague holds 34 GB of 40 got every 8 GB trial once it was
    the idle one, each failed oom, alone and so not retried (a third of a sweep's configs lost); and
    max_gpu_util did not keep trials off a GPU others saturate."""
    capped = Policy(margin=0.1, max_trials=8, max_util=50)
    full, ours = Room(total_mb=40000, used_mb=30000, util=100), Room(total_mb=40000, used_mb=32000, charges=(32000.0,))
    assert not suits(full, 8000.0, POLICY) and not suits(Room(40000, 0, util=100), None, capped)
    assert suits(ours, 8000.0, capped)  # ours will free up: 36,000 of budget, none of it others'
    assert choose({"busy": full, "ours": ours}, 8000.0, POLICY) is None  # waits for "ours" to end
    assert choose({"busy": full, "ours": Room(40000, 0)}, 8000.0, POLICY) == "ours"
    assert choose({"busy": full, "ours": ours}, 3000.0, POLICY) == "busy"  # a shape that fits goes there
    assert choose({"busy": Room(40000, 0, util=100), "ours": ours}, 3000.0, capped) == "ours"  # not the saturated
    # where no GPU suits the trial, the idle one still takes it: a sweep never waits for what cannot free up
    assert choose({"busy": full}, 8000.0, POLICY) == "busy"


def test_shape_key_is_the_model_params():
    key = shape_key({"model.d_model": 64, "train.lr": 0.01, "model.name": "lstm"})
    assert key == (("model.d_model", "64"), ("model.name", "'lstm'"))
    assert shape_key({"train.lr": 0.02}) == shape_key({}) == ()


# ------------------------------------------------------------------ the driver's packer


def _trial(number, state, params, **attrs):
    return SimpleNamespace(number=number, state=state, params=params, user_attrs=attrs)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "1")
    monkeypatch.setenv("SWEEPER_FAKE_GPU_MEMORY_MB", "4000")
    monkeypatch.setattr("sweeper.dispatch.packer.Packer._write", lambda self, trial_id, key, value:
                        self.writes.append((trial_id, key, value)), raising=True)
    packer = Packer(DevicesConfig(trials_per_gpu="auto"), list_gpus(), study=None)
    packer.writes = []
    return packer, list_gpus()[0].uuid


def test_packer_learns_peaks_of_finished_trials_with_the_same_model_params(one_gpu):
    packer, gpu = one_gpu
    big, small = {"model.hidden": 64}, {"model.hidden": 8}
    packer.learn([_trial(0, TrialState.COMPLETE, {**big, "train.lr": 0.1}, peak_mem_mb=2500.0),
                  _trial(1, TrialState.PRUNED, {**big, "train.lr": 0.2}, peak_mem_mb=2000.0, probe_peak_mem_mb=2900.0),
                  _trial(2, TrialState.FAIL, small, peak_mem_mb=10.0),
                  _trial(3, TrialState.COMPLETE, small, peak_mem_mb=float("nan"))])
    assert packer.peaks == {shape_key(big): 2900.0}
    held = Held(trial_id=7, number=7, params={**big, "train.lr": 0.3}, exclusive=False)
    placement = packer.place(held, [gpu])
    assert (placement.gpu, placement.allotted_mb, placement.shared_with) == (gpu, 3600.0, 0)
    unknown = Held(trial_id=8, number=8, params=small, exclusive=False)
    packer.start(held, placement)
    assert packer.place(unknown, [gpu]) is None  # never measured: it waits for a GPU of its own


def test_packer_charges_running_trials_and_counts_who_shared(one_gpu):
    packer, gpu = one_gpu
    first = Held(trial_id=10, number=0, params={}, exclusive=False)
    p0 = packer.place(first, [gpu])
    assert (p0.allotted_mb, p0.shared_with) == (3600.0, 0)
    packer.start(first, p0)
    assert packer.writes == [(10, "gpu_shared_with", 0)]
    assert packer.gate([gpu]) is None  # charged all 3600 MB until it measures
    packer.measured(0, 1200.0)
    assert packer.gate([gpu]) == gpu
    second = Held(trial_id=11, number=1, params={}, exclusive=False)
    p1 = packer.place(second, [gpu])
    assert (p1.allotted_mb, p1.shared_with) == (1500.0, 1)
    packer.start(second, p1)
    assert packer.writes[1:] == [(10, "gpu_shared_with", 1), (11, "gpu_shared_with", 1)]
    packer.measured(1, "1200.0")  # an epoch's metrics carry it as JSON
    third = Held(trial_id=12, number=2, params={}, exclusive=False)
    p2 = packer.place(third, [gpu])
    assert (p2.allotted_mb, p2.shared_with) == (1200.0, 2)
    packer.start(third, p2)
    assert packer.writes[3:] == [(10, "gpu_shared_with", 2), (11, "gpu_shared_with", 2), (12, "gpu_shared_with", 2)]
    assert packer.gate([gpu]) is None
    packer.ended(1, "COMPLETE", {"peak_mem_mb": 1300.0})
    packer.ended(2, "FAIL", {})  # trial 2 failed: its worker's END or exit drops it too
    assert sorted(packer.running) == [0] and packer.peaks == {(): 1300.0}
    assert packer.place(Held(13, 3, {}, exclusive=True), [gpu]) is None  # a retry after an OOM waits
    packer.ended(0, "FAIL", {})
    exclusive = packer.place(Held(13, 3, {}, exclusive=True), [gpu])
    assert (exclusive.allotted_mb, exclusive.shared_with) == (3600.0, 0)


def test_a_gpu_others_fill_is_read_from_nvml(one_gpu, monkeypatch):
    packer, gpu = one_gpu
    packer.peaks[()] = 1000.0
    packer.start(Held(1, 1, {}, False), packer.place(Held(1, 1, {}, False), [gpu]))
    packer.measured(1, 1000.0)
    assert packer.gate([gpu]) == gpu
    packer.gpus[gpu].used_mb = 3000  # others hold 2000 MB beyond our 1000: 600 MB free
    packer.read_at = float("inf")  # no fresh NVML read over this by the fake
    assert packer.gate([gpu]) is None


def test_the_packer_judges_a_gpu_others_fill_against_all_its_gpus_not_only_those_with_a_worker_free(monkeypatch):
    """The driver asks of the GPUs with a worker free: the one a colleague fills was the only one asked while
    ours ran on the other, so every measured 8 GB trial (an exclusive retry too) went there and failed oom."""
    monkeypatch.setenv("SWEEPER_FAKE_GPUS", "2")
    monkeypatch.setenv("SWEEPER_FAKE_GPU_MEMORY_MB", "40000")
    monkeypatch.setattr("sweeper.dispatch.packer.Packer._write", lambda self, trial_id, key, value: None)
    packer = Packer(DevicesConfig(trials_per_gpu="auto", max_trials_per_gpu=1), list_gpus(), study=None)
    filled, ours = (g.uuid for g in list_gpus())
    packer.gpus[filled].used_mb, packer.read_at = 30000, float("inf")  # a colleague's 30 GB, read once
    packer.peaks[()] = 8000.0
    packer.start(Held(1, 1, {}, False), packer.place(Held(1, 1, {}, False), [ours]))
    for exclusive in (False, True):
        assert packer.place(Held(2, 2, {}, exclusive), [filled]) is None  # it waits for ours to end
    assert packer.gate([filled]) is None  # nor is a trial claimed for it
    packer.peaks[()] = 3000.0  # a shape that fits what the colleague leaves goes there
    assert packer.place(Held(2, 2, {}, False), [filled]).gpu == filled


def _worker(uuid, started, ready, running=None):
    # idle as WorkerHandle.idle: packing gives the baseline job no turn, so none is reserved
    return SimpleNamespace(slot=SimpleNamespace(gpu=SimpleNamespace(uuid=uuid)), started=started, ready=ready,
                           running=running, idle=ready and running is None)


def test_workers_by_gpu_offers_one_spare_only_where_none_is_free_or_starting():
    a0, a1, a2 = _worker("a", True, True, running=1), _worker("a", False, False), _worker("a", False, False)
    b0, b1 = _worker("b", True, True), _worker("b", False, False)
    c0, c1 = _worker("c", True, False), _worker("c", False, False)
    assert first_per_gpu([a0, a1, a2, b0, b1, c0, c1]) == [a0, b0, c0]
    idle, spare = workers_by_gpu([a0, a1, a2, b0, b1, c0, c1])
    assert idle == {"b": b0} and spare == {"a": a1}


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("devices, message", [
    ({"trials_per_gpu": 0}, "devices.trials_per_gpu"),
    ({"trials_per_gpu": "many"}, "devices.trials_per_gpu"),
    ({"memory_margin": 1.0}, "devices.memory_margin"),
    ({"max_trials_per_gpu": 0}, "devices.max_trials_per_gpu"),
    ({"max_gpu_util": 120}, "devices.max_gpu_util"),
])
def test_bad_devices_keys_are_config_errors_naming_the_key(study_file, devices, message):
    with pytest.raises(ConfigError, match=f"study.yaml: {message}"):
        load_config(study_file({"devices": devices}))


def test_trials_per_gpu_takes_auto_or_a_count(study_file):
    assert load_config(study_file({"devices": {"trials_per_gpu": "auto"}})).devices.trials_per_gpu == "auto"
    assert load_config(study_file(), sets=["devices.trials_per_gpu=3"]).devices.trials_per_gpu == 3


# ------------------------------------------------------------------ real sweeps on a fake GPU


def _packed_sweep(study_file, workdir, trial_mb: int, n_trials: int, step_sleep: float,
                  space: dict | None = None, seed=None):
    """A real ``sweeper run`` (in this process: the packer is the driver's, its workers real
    processes) on one fake 4000 MB GPU whose trials report ``trial_mb``; its trials.
    ``seed(study)`` fills the study first (queued trials, finished ones)."""
    path = study_file({
        "study": {"n_trials": n_trials},
        "model": {"name": "fault_models:Slow", "step_sleep": step_sleep, "hidden": 8},
        "train": {"epochs": 2, "batch_size": 256, "samples_per_epoch": 1024},
        "devices": {"gpus": "auto", "trials_per_gpu": "auto"},
        **({"search_space": space} if space else {}),
    }, replace=("model", "search_space") if space else ("model",))
    storage = load_config(path).study.resolved_storage
    if seed is not None:
        seed(optuna.create_study(study_name="tiny", storage=open_storage(storage), direction="maximize"))
    env = {"SWEEPER_FAKE_GPUS": "1", "SWEEPER_FAKE_GPU_MEMORY_MB": "4000",
           "SWEEPER_FAKE_TRIAL_MEMORY_MB": str(trial_mb)}
    sweeper_cli(Path.cwd(), "run", str(path), env=env)
    return optuna.load_study(study_name="tiny", storage=storage).get_trials()


@pytest.mark.slow
def test_1200_mb_trials_share_a_4000_mb_gpu_two_or_three_at_once(study_file, workdir):
    # trials of about 4 s: longer than a worker takes to start, so packing has the chance
    trials = _packed_sweep(study_file, workdir, 1200, n_trials=5, step_sleep=0.5)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    assert 2 <= most_at_once(trials) <= 3
    ua = [t.user_attrs for t in trials]
    assert {u["peak_mem_mb"] for u in ua} == {1200.0}
    assert ua[0]["gpu_mem_allotted_mb"] == 3600.0  # the first: no peak measured yet, the whole budget
    # beside others, 1.25 x 1200 within what is left; alone (between trials), all of it
    assert {u["gpu_mem_allotted_mb"] for u in ua[1:]} <= {1200.0, 1500.0, 3600.0}
    assert {u["gpu_mem_allotted_mb"] for u in ua[1:]} & {1200.0, 1500.0}
    assert max(u["gpu_shared_with"] for u in ua) == most_at_once(trials) - 1
    assert {u["device"] for u in ua} <= {"gpu0#0", "gpu0#1", "gpu0#2"}
    # the report's device timeline: one row per worker, and each trial's sharing in its hover
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{workdir}/runs/tiny/study.db")
    fig = timeline_figure(StudyData("tiny", "val_ic", True, trials, workdir / "runs/tiny", study))
    hover = sorted(row[1] for trace in fig.data for row in trace.customdata)
    assert hover == sorted(f"<br>GPU shared with {u['gpu_shared_with']} other trial(s); allotted "
                           f"{u['gpu_mem_allotted_mb']:.0f} MB, peak 1200 MB" for u in ua)


@pytest.mark.slow
def test_3000_mb_trials_run_one_at_a_time(study_file, workdir):
    trials = _packed_sweep(study_file, workdir, 3000, n_trials=3, step_sleep=0.1)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert most_at_once(trials) == 1
    # and no second worker was even started for one (a worker starts as soon as packing sees room)
    assert {t.user_attrs["device"] for t in trials} == {"gpu0#0"}
    assert [p.name.split(".")[-2] for p in (workdir / "runs/tiny/logs").glob("*.slot-*.log")] == ["slot-0"]
    assert [(t.user_attrs["gpu_mem_allotted_mb"], t.user_attrs["gpu_shared_with"]) for t in trials] == \
        [(3600.0, 0)] * 3


SHAPES = {"model.hidden": {"type": "categorical", "choices": [8, 16]},
          "model.step_sleep": {"type": "categorical", "choices": [0.1, 0.3, 1.5]},
          "train.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}


@pytest.mark.slow
def test_an_unmeasured_shape_and_an_exclusive_trial_wait_for_the_gpu_to_themselves(study_file, workdir):
    def seed(study):
        for hidden, attrs in ((8, {}), (8, {}), (16, {}), (8, {"exclusive_gpu": True}), (8, {})):
            study.enqueue_trial({"model.hidden": hidden, "model.step_sleep": 0.3}, user_attrs=attrs)

    trials = _packed_sweep(study_file, workdir, 1200, n_trials=5, step_sleep=0.3, space=SHAPES, seed=seed)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    ua = [t.user_attrs for t in trials]
    # hidden=16 was never measured and trial 3 must have the GPU to itself: each started alone
    assert [ua[k]["gpu_mem_allotted_mb"] for k in (0, 2, 3)] == [3600.0] * 3
    assert [ua[k]["gpu_shared_with"] for k in (2, 3)] == [0, 0]
    assert trials[4].datetime_start >= trials[3].datetime_complete  # and nothing joined trial 3


@pytest.mark.slow
def test_a_trial_that_outgrows_its_allotment_beside_another_fails_as_oom(study_file, workdir):
    small = {"model.hidden": 8, "model.step_sleep": 0.1}

    def seed(study):
        # a finished trial of the small shape that peaked at 500 MB (its params differed elsewhere)
        dists = {"model.hidden": optuna.distributions.CategoricalDistribution([8, 16]),
                 "model.step_sleep": optuna.distributions.CategoricalDistribution([0.1, 0.3, 1.5]),
                 "train.lr": optuna.distributions.FloatDistribution(1e-3, 1e-2, log=True)}
        study.add_trial(optuna.trial.create_trial(params={**small, "train.lr": 0.005}, distributions=dists,
                                                  value=0.01, user_attrs={"peak_mem_mb": 500.0}))
        study.enqueue_trial({"model.hidden": 16, "model.step_sleep": 1.5})  # 12 s alone; measures 1200 MB
        study.enqueue_trial(small)  # expected at 500 MB, so given 625 beside it: too little for 1200
        study.enqueue_trial({"model.hidden": 16, "model.step_sleep": 0.1})

    trials = _packed_sweep(study_file, workdir, 1200, n_trials=4, step_sleep=0.1, space=SHAPES, seed=seed)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL,
                                         TrialState.COMPLETE, TrialState.COMPLETE]
    oom = trials[2].user_attrs
    assert (oom["fail_reason"], oom["gpu_mem_allotted_mb"], oom["gpu_shared_with"]) == ("oom", 625.0, 1)
    assert "fake GPU: the trial needs 1200 MB and was allotted 625 MB" in oom["error"]
    assert trials[1].user_attrs["gpu_shared_with"] == 1
    assert trials[3].user_attrs["gpu_mem_allotted_mb"] == 3600.0
    # retried once with the GPU to itself: all of it, and nobody beside it
    retry = trials[4]
    assert (retry.params, retry.user_attrs["retry_of"], retry.user_attrs["exclusive_gpu"]) == \
        (trials[2].params, 2, True)
    assert (retry.user_attrs["gpu_mem_allotted_mb"], retry.user_attrs["gpu_shared_with"]) == (3600.0, 0)
