"""What the driver's plain view says of a trial of several runs: which fold and seed an epoch
belongs to, and what its value is called under validation.aggregate: lcb."""
from __future__ import annotations

import io
import re

from optuna.trial import TrialState

from sweeper import config as C
from sweeper.devices.slots import Slot
from sweeper.dispatch.live import PlainView

SLOT = Slot(id=0, kind="cpu", gpu=None, env={}, threads=1, label="cpu0")


def _lines(stream: io.StringIO) -> list[str]:
    return [re.sub(r"^\[[0-9:]+\] ", "", line) for line in stream.getvalue().splitlines()]


def test_epoch_lines_name_the_fold_and_seed_and_the_end_line_the_objective():
    out = io.StringIO()
    view = PlainView(out)
    view.metric, view.objective = "val_ic", C.objective_label(
        "val_ic", C.ValidationConfig(scheme="walk_forward", aggregate="lcb"))
    view.several = True  # what start() sets for a study of several runs per trial
    view.epoch(SLOT, 3, 2, {"fold": 2, "repeat": 1, "val_ic": 0.0312, "train_loss": 1.01,
                            "micro_batch_size": 256})
    view.epoch(SLOT, 5, 1, {"fold": 1, "repeat": 2, "val_ic": 0.01, "train_loss": 1.0, "micro_batch_size": 64,
                            "stack": 4})  # a run that trains in a stack of 4 says so
    view.trial_ended(SLOT, 3, TrialState.COMPLETE, 0.0117, None)
    # a holdout trial's one run: its rows name fold 1, seed 1 (the one layout), its lines do not
    holdout = PlainView(out)
    holdout.epoch(SLOT, 4, 1, {"fold": 1, "repeat": 1, "val_ic": 0.02, "train_loss": 1.0, "micro_batch_size": 64})
    # a pruned trial's value is its best epoch's; the study keeps Optuna's (its last report): said so
    view.trial_ended(SLOT, 6, TrialState.PRUNED, 0.0037, None)
    view.trial_ended(SLOT, 7, TrialState.PRUNED, None, None)  # cut short before its last fold: no value
    assert _lines(out) == ["trial 3 fold 2 seed 1 epoch 2: val_ic=0.0312 loss=1.0100 mb=256",
                           "trial 5 fold 1 seed 2 (stack of 4) epoch 1: val_ic=0.0100 loss=1.0000 mb=64",
                           "trial 3 complete: lcb(val_ic)=0.0117",
                           "trial 4 epoch 1: val_ic=0.0200 loss=1.0000 mb=64",
                           "trial 6 pruned: lcb(val_ic)=0.0037 (its best epoch; the study keeps its last epoch's)",
                           "trial 7 pruned: lcb(val_ic)=-"]


def test_the_objective_is_the_metric_unless_lcb():
    assert C.objective_label("val_rank_ic", C.ValidationConfig()) == "val_rank_ic"
    assert C.objective_label("val_ic", C.ValidationConfig(scheme="walk_forward")) == "val_ic"
    assert C.objective_label("val_loss", C.ValidationConfig(repeats=2, aggregate="lcb")) == "lcb(val_loss)"


def test_the_live_eta_is_estimated_from_epochs_before_the_first_trial_ends():
    from sweeper.dispatch.live import RichView

    view = RichView()
    view.started, view.n_trials, view.run_epochs_per_trial = 100.0, 4, 6  # e.g. 2 folds x 3 epochs
    assert view.eta(now=160.0) == "ETA -"  # nothing trained yet: nothing to go by
    for _ in range(3):
        view.epoch(SLOT, 0, 1, {"val_ic": 0.01})
    # 3 run epochs in 60 s; 4 trials x 6 - 3 = 21 left at that pace: 420 s
    assert view.eta(now=160.0) == "ETA ~7.0 min (from the epochs so far)"
    view.trial_ended(SLOT, 0, TrialState.COMPLETE, 0.01, None)  # then the finished trials' pace
    assert view.eta(now=220.0) == "ETA 6.0 min"  # 3 left at 120 s each


def test_a_trial_start_line_shows_each_param_as_it_was_drawn():
    out = io.StringIO()
    PlainView(out).trial_started(SLOT, 2, {"train.lr": 0.0012345678, "model.gradient_checkpointing": True,
                                           "train.batch_size": 512, "model.pooling": "mean"})
    assert _lines(out) == ["trial 2 started on cpu0: train.lr=0.001235 model.gradient_checkpointing=True "
                           "train.batch_size=512 model.pooling=mean"]  # a boolean read 1 (and 1.0000 in best)


def test_the_closing_hint_offers_best_only_when_a_trial_completed():
    from types import SimpleNamespace

    from sweeper.dispatch.stopping import Ending, SweepResult

    out = io.StringIO()
    # no best trial: the config and the panel are not read
    PlainView(out).close(SweepResult({"FAIL": 2, "PRUNED": 1}, None, Ending.DONE), None,  # type: ignore[arg-type]
                         SimpleNamespace(study_file="s.yaml"))  # type: ignore[arg-type]
    assert _lines(out) == ["trials: fail 2, pruned 1",
                           "next: sweeper status s.yaml | sweeper report s.yaml -o report.html | "
                           "sweeper dashboard s.yaml"]


def test_the_group_neutral_valid_ic_says_when_it_is_the_last_fold_s():
    """Under walk-forward it is computed on the model run's frames, the last fold's valid block, and was
    printed under the valid IC by year of every fold without saying so."""
    from sweeper.inspect.printing import ic_time_lines

    best = {"group_col": "sector", "group_neutral": {"valid": {"ic": 0.0215, "rank_ic": 0.02},
                                                     "test": {"ic": 0.011, "rank_ic": 0.012}},
            "scored_on": {"group_neutral": {"valid": {"over": "last fold", "dates": ["2021-05-06", "2021-05-27"]},
                                            "test": {"over": "test", "dates": ["2021-06-10", "2021-12-30"]}}}}
    assert ic_time_lines(best) == [
        "group-neutral IC (demeaned within sector per date): valid (the last fold's valid block, 2021-05-06 to "
        "2021-05-27) ic 0.0215 rank_ic 0.0200  test ic 0.0110 rank_ic 0.0120"]
    best["scored_on"]["group_neutral"]["valid"] = {"over": "valid", "dates": ["2021-05-06", "2021-05-27"]}
    assert ic_time_lines(best) == ["group-neutral IC (demeaned within sector per date): valid ic 0.0215 "
                                   "rank_ic 0.0200  test ic 0.0110 rank_ic 0.0120"]  # holdout: as before


def test_the_live_panel_gives_the_terminal_back_when_the_workers_shutdown_is_cut_short(tmp_path):
    # a second Ctrl-C during the shutdown raises out of run(), which never reaches view.close: the
    # panel was left started, its cursor hidden on the user's terminal
    from types import SimpleNamespace

    import pytest
    from rich.console import Console
    from rich.live import Live

    from sweeper.dispatch.live import RichView
    from sweeper.dispatch.run import _sweep
    from sweeper.errors import StopRequested

    class Shown(RichView):  # start() as the driver's, without a study to read
        def start(self, cfg, plan, study):  # type: ignore[no-untyped-def]
            self.live = Live(console=self.console, transient=True)
            self.live.start()

    out = io.StringIO()
    view = Shown()
    view.console = Console(file=out, force_terminal=True)

    def shutdown() -> None:
        raise StopRequested()  # the second signal

    driver = SimpleNamespace(stop=SimpleNamespace(raise_at_once=False), loop=lambda: None, shutdown=shutdown)
    with pytest.raises(StopRequested):
        _sweep(driver, SimpleNamespace(run_dir=tmp_path, slots=[], cfg=None), None, view)  # type: ignore[arg-type]
    assert not view.live.is_started
    assert out.getvalue().startswith("\x1b[?25l") and "\x1b[?25h" in out.getvalue()  # hidden, then shown
