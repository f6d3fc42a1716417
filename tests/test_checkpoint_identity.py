"""A checkpoint belongs to one trial of one study on one dataset: a re-created study, a study of
the same name in another storage, or other data never continues another's weights; a retry still
continues its own. Real sweeps, real SQLite stores, real checkpoint files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

from conftest import sweeper_cli
from sweeper.config import load_config
from sweeper.core import checkpoint_epoch
from sweeper.core.checkpoint import checkpoint_meta
from sweeper.data import write_synthetic
from sweeper.dispatch.live import NullView
from sweeper.dispatch.run import init_db, run
from sweeper.worker.adoption import foreign, owner

# checkpoints are kept so that there is something to adopt wrongly
KEEP = {"study": {"n_trials": 2, "keep": {"checkpoints": "all"}}, "devices": {"cpu_workers": 1},
        "train": {"epochs": 3}}


def _sweep(path, storage=None):
    cfg = load_config(path)
    outcome = run(cfg, view=NullView(), storage_url=storage)
    url = storage or cfg.study.resolved_storage
    return outcome, optuna.load_study(study_name=cfg.study.name, storage=url)


def _on_file(study_file, seed):
    write_synthetic("panel.parquet", assets=24, dates=160, features=3, seed=seed)
    return study_file({**KEEP, "data": {"synthetic": None, "path": "panel.parquet"}})


def _fresh(t, epochs=3):
    log = Path(f"runs/tiny/trials/{t.number}/train.log").read_text()
    return (sorted(t.intermediate_values) == list(range(1, epochs + 1)) and "resum" not in log
            and "resumed_from_epoch" not in t.user_attrs)


@pytest.mark.slow
def test_a_recreated_study_on_new_data_trains_every_trial_from_scratch(study_file, capfd):
    path = _on_file(study_file, seed=1)
    _, first = _sweep(path)
    old_uuid = first.user_attrs["study_uuid"]
    old = {t.number: t.user_attrs["test_ic"] for t in first.get_trials()}
    assert checkpoint_epoch("runs/tiny/trials/0/checkpoint.pt") == 3
    # the user starts over: deletes the database, keeps runs/, writes other data to the same path
    Path("runs/tiny/study.db").unlink()
    write_synthetic("panel.parquet", assets=24, dates=160, features=3, seed=2)
    capfd.readouterr()
    outcome, second = _sweep(path)
    assert outcome.exit_code == 0
    aside = Path(f"runs/tiny/previous/{old_uuid}")
    assert f"runs/tiny held another study's trials, logs (study_uuid {old_uuid}): " \
           f"moved aside to {aside}" in capfd.readouterr().err
    assert second.user_attrs["study_uuid"] != old_uuid
    trials = second.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all(_fresh(t) for t in trials)
    assert all(t.user_attrs["test_ic"] != old[t.number] for t in trials)
    # the old study's files are kept, whole
    assert checkpoint_epoch(aside / "trials/0/checkpoint.pt") == 3
    meta = checkpoint_meta("runs/tiny/trials/0/checkpoint.pt")
    assert meta["owner"] == {"study_uuid": second.user_attrs["study_uuid"], "trial": 0,
                             "fingerprint": second.user_attrs["data_fingerprint"],
                             "fold": 1, "repeat": 1, "fold_dates": {}}  # a holdout trial's one run
    assert json.loads(Path("runs/tiny/owner.json").read_text())["study_uuid"] == second.user_attrs["study_uuid"]


@pytest.mark.slow
def test_a_fresh_trial_never_continues_a_checkpoint_left_at_its_path(study_file):
    path = study_file(KEEP)
    _sweep(path)
    shutil.copy("runs/tiny/trials/0/checkpoint.pt", "left.pt")
    shutil.rmtree("runs")
    init_db(load_config(path))  # the new study exists; its folder is then claimed for it by hand
    study = optuna.load_study(study_name="tiny", storage="sqlite:///runs/tiny/study.db")
    Path("runs/tiny").mkdir(exist_ok=True)
    Path("runs/tiny/owner.json").write_text(json.dumps({"study_uuid": study.user_attrs["study_uuid"]}))
    Path("runs/tiny/trials/0").mkdir(parents=True)
    shutil.copy("left.pt", "runs/tiny/trials/0/checkpoint.pt")
    _, study = _sweep(path)
    first = study.get_trials()[0]
    log = Path("runs/tiny/trials/0/train.log").read_text()
    assert ("removing runs/tiny/trials/0/checkpoint.pt: a trial continues only its retry source's "
            "checkpoint; starting fresh") in log
    assert sorted(first.intermediate_values) == [1, 2, 3] and "resumed_from_epoch" not in first.user_attrs
    assert checkpoint_meta("runs/tiny/trials/0/checkpoint.pt")["owner"]["study_uuid"] == study.user_attrs[
        "study_uuid"]


@pytest.mark.slow
def test_a_retry_resumes_from_its_own_checkpoint_and_not_from_another_storages(study_file):
    path = study_file(KEEP)
    _, one = _sweep(path)
    t0 = one.get_trials()[0]
    # the same study name in another storage, sharing the artifacts folder
    _, two = _sweep(path, storage="sqlite:///other.db")
    assert all(_fresh(t) for t in two.get_trials())
    assert two.user_attrs["study_uuid"] != one.user_attrs["study_uuid"]
    shutil.copy("runs/tiny/trials/0/checkpoint.pt", "two-0.pt")  # the second study's trial 0
    # in the first study: a retry of trial 0 from the other study's checkpoint, one from its own
    one.enqueue_trial(t0.params, user_attrs={"retry_of": 0, "attempt": 1, "resume_from": str(Path("two-0.pt"))})
    one.enqueue_trial(t0.params, user_attrs={"retry_of": 0, "attempt": 1,
                                             "resume_from": t0.user_attrs["checkpoint"]})
    path = study_file({**KEEP, "study": {**KEEP["study"], "n_trials": 4}})
    _, one = _sweep(path)
    foreign_retry, own_retry = one.get_trials()[2:]
    why = (f"the checkpoint belongs to another study (study_uuid {two.user_attrs['study_uuid']}, "
           f"this study's is {one.user_attrs['study_uuid']})")
    assert foreign_retry.user_attrs["resume_skipped"] == why
    assert sorted(foreign_retry.intermediate_values) == [1, 2, 3]
    assert "resumed_from_epoch" not in foreign_retry.user_attrs
    # the first study's own files came back when it ran again, so its own checkpoint is where it was
    assert own_retry.user_attrs["resumed_from_epoch"] == 3 and "resume_skipped" not in own_retry.user_attrs
    assert own_retry.intermediate_values == t0.intermediate_values


STAMP = owner("u1", 4, "fp-new")


@pytest.mark.parametrize(("was", "lineage", "why"), [
    ({"study_uuid": "u1", "trial": 4, "fingerprint": "fp-new"}, [4], None),
    ({"study_uuid": "u1", "trial": 2, "fingerprint": "fp-new"}, [4, 2], None),
    (None, [4], "the checkpoint does not say which study wrote it (an older sweeper)"),
    ({"study_uuid": "u0", "trial": 4, "fingerprint": "fp-new"}, [4],
     "the checkpoint belongs to another study (study_uuid u0, this study's is u1)"),
    ({"study_uuid": "u1", "trial": 4, "fingerprint": "fp-old"}, [4],
     "the checkpoint was trained on other data (fingerprint fp-old, now fp-new)"),
    ({"study_uuid": "u1", "trial": 7, "fingerprint": "fp-new"}, [4, 2],
     "the checkpoint belongs to trial 7, not to a trial this one retries"),
])
def test_which_checkpoint_a_retry_may_continue(was, lineage, why):
    assert foreign({"epoch": 3, "config": {}, "owner": was}, STAMP, lineage) == why


@pytest.mark.slow
def test_a_second_run_of_the_same_study_moves_nothing_aside(tmp_path):
    # from the command line (in process): the folder already is this study's, so nothing moves and
    # no line says so
    cfg = {"study": {"name": "s", "n_trials": 1}, "data": {"synthetic": {"assets": 12, "dates": 60,
           "features": 2}, "lookback": 3}, "model": {"name": "mlp", "hidden_size": 4},
           "train": {"epochs": 1, "batch_size": 64}, "devices": {"gpus": "none", "cpu_workers": 1}}
    (tmp_path / "s.yaml").write_text(json.dumps(cfg))
    for _ in range(2):
        done = sweeper_cli(tmp_path, "run", "s.yaml")
        assert "moved aside" not in done.output
    assert not (tmp_path / "runs/s/previous").exists()


@pytest.mark.slow
def test_best_and_predict_read_a_studys_own_files_after_another_took_the_folder(study_file):
    from sweeper.inspect.predict import predict_trial
    from sweeper.inspect.results import best_report

    path = study_file(KEEP)
    _, one = _sweep(path)
    _sweep(path, storage="sqlite:///other.db")  # the same name in another storage takes runs/tiny
    aside = Path(f"runs/tiny/previous/{one.user_attrs['study_uuid']}")
    cfg = load_config(path)
    best = best_report(one, cfg)
    assert best["weights"] == str(aside / f"trials/{best['trial']}/weights.pt")
    assert best["ic_by_year"]["valid"]  # read from its own daily IC files
    pred = predict_trial(cfg, one, trial="best", split="valid")
    # its own weights: the valid IC predict scores is the one its trial stored
    assert pred.trial == best["trial"]
    from sweeper.quant.ic import ic_report

    assert ic_report(pred.frame)["ic"] == pytest.approx(best["metrics"]["val_ic"], abs=1e-6)
