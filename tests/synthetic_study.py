"""A large study written straight into SQLite through Optuna, without training anything.

For the report's tests and its benchmark (benchmarks/report.py): ``build`` writes a
study file, ``runs/<name>/study.db`` with ``n`` trials on four GPU slots (params,
intermediate values, the user attributes a real trial carries, start and end times)
and the daily IC CSVs of a subset of trials, the best one included.

``Study.add_trials`` costs ~60 ms a trial in SQLite (one ORM round trip per value),
so the trials go in through Optuna's own table models in one session instead: the
same rows, written in about a second. Optuna is pinned (5.0), and the test that
reads them back through ``optuna.load_study`` would notice a schema change.
"""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

DEVICES = ("gpu0", "gpu1", "gpu2", "gpu3")
DISTRIBUTIONS = {
    "train.lr": FloatDistribution(1e-4, 1e-2, log=True),
    "model.d_model": CategoricalDistribution([32, 64, 128]),
    "model.num_layers": IntDistribution(1, 4),
    "model.dropout": FloatDistribution(0.0, 0.3),
}
EPOCHS = 20
VALID_DATES, TEST_DATES = 120, 120
START = datetime(2024, 3, 1, 9, 0, 0)


def study_config(name: str) -> dict:
    return {
        "study": {"name": name, "n_trials": 500},
        "data": {"synthetic": {"assets": 24, "dates": 160, "features": 3, "seed": 1}, "lookback": 5},
        "model": {"name": "mlp", "hidden_size": 8},
        "search_space": {"train.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
    }


def _state(k: int) -> TrialState:
    if k % 50 == 7:
        return TrialState.FAIL
    if k % 7 == 3:
        return TrialState.PRUNED
    return TrialState.COMPLETE


def _trial(k: int, rng: np.random.Generator, clock: dict[str, datetime]) -> FrozenTrial:
    state = _state(k)
    params = {"train.lr": float(10 ** rng.uniform(-4, -2)), "model.d_model": int(rng.choice([32, 64, 128])),
              "model.num_layers": int(rng.integers(1, 5)), "model.dropout": float(rng.uniform(0, 0.3))}
    skill = 0.04 - 0.01 * abs(math.log10(params["train.lr"]) + 3) + rng.normal(0, 0.005)
    epochs = {TrialState.COMPLETE: EPOCHS, TrialState.PRUNED: 4, TrialState.FAIL: 2}[state]
    curve = {e: float(skill * (1 - math.exp(-e / 4)) + rng.normal(0, 0.002)) for e in range(1, epochs + 1)}
    device = DEVICES[k % len(DEVICES)]
    start = clock[device] + timedelta(seconds=float(rng.uniform(0.5, 3)))
    end = start + timedelta(seconds=3 * epochs + float(rng.uniform(0, 5)))
    clock[device] = end
    val_ic = max(curve.values())
    attrs = {"device": device, "slot": k % len(DEVICES), "host": "bench", "driver_id": "d0", "epochs_run": epochs}
    if state != TrialState.FAIL:
        attrs.update(val_ic=val_ic, test_ic=float(val_ic * 0.7 + rng.normal(0, 0.004)), val_rank_ic=val_ic * 1.1,
                     best_epoch=max(curve, key=curve.get), duration_s=(end - start).total_seconds())
    else:
        attrs.update(fail_reason="crash", error="RuntimeError: boom")
    return FrozenTrial(number=k, trial_id=k, state=state, value=val_ic if state == TrialState.COMPLETE else None,
                       values=None, datetime_start=start, datetime_complete=end, params=params,
                       distributions=DISTRIBUTIONS, user_attrs=attrs, system_attrs={},
                       intermediate_values=curve)


def _daily(path: Path, mean: float, dates: pd.DatetimeIndex, rng: np.random.Generator) -> None:
    ic = rng.normal(mean, 0.08, len(dates))
    pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "ic": ic, "rank_ic": ic * 1.05}).to_csv(path, index=False)


def _utc(value: datetime | None) -> datetime | None:
    # the trials table holds naive UTC; FrozenTrial holds naive local time
    return None if value is None else value.astimezone(UTC).replace(tzinfo=None)


def _bulk_add(storage: optuna.storages.RDBStorage, study_id: int, trials: list[FrozenTrial]) -> None:
    """Insert the trials and their rows with one executemany per table (SQLAlchemy Core)."""
    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models as M
    from sqlalchemy import func, insert, select

    value_repr = M.TrialValueModel.value_to_stored_repr
    step_repr = M.TrialIntermediateValueModel.intermediate_value_to_stored_repr
    rows: dict[type, list[dict]] = {M.TrialModel: [], M.TrialParamModel: [], M.TrialValueModel: [],
                                    M.TrialIntermediateValueModel: [], M.TrialUserAttributeModel: []}
    with storage.engine.begin() as conn:
        first = (conn.execute(select(func.max(M.TrialModel.trial_id))).scalar() or 0) + 1
        for k, t in enumerate(trials):
            tid = first + k
            rows[M.TrialModel].append({"trial_id": tid, "number": t.number, "study_id": study_id, "state": t.state,
                                       "datetime_start": _utc(t.datetime_start),
                                       "datetime_complete": _utc(t.datetime_complete)})
            rows[M.TrialParamModel] += [
                {"trial_id": tid, "param_name": name, "param_value": t.distributions[name].to_internal_repr(v),
                 "distribution_json": distribution_to_json(t.distributions[name])} for name, v in t.params.items()]
            if t.value is not None:
                value, kind = value_repr(t.value)
                rows[M.TrialValueModel].append({"trial_id": tid, "objective": 0, "value": value, "value_type": kind})
            rows[M.TrialIntermediateValueModel] += [
                dict(zip(("trial_id", "step", "intermediate_value", "intermediate_value_type"), (tid, step, *step_repr(v))))
                for step, v in t.intermediate_values.items()]
            rows[M.TrialUserAttributeModel] += [{"trial_id": tid, "key": key, "value_json": json.dumps(v)}
                                                for key, v in t.user_attrs.items()]
        for model, batch in rows.items():
            if batch:
                conn.execute(insert(model.__table__), batch)


def build(root: Path, n: int = 500, n_daily: int = 60, name: str = "big", seed: int = 0) -> Path:
    """Write the study under ``root``; returns the study file. Trials numbered below
    ``n_daily`` (and the best trial) get daily IC files."""
    from sweeper.store import open_storage

    root = Path(root)
    study_file = root / f"{name}.yaml"
    study_file.write_text(yaml.safe_dump(study_config(name)))
    run_dir = root / "runs" / name
    storage = open_storage(f"sqlite:///{run_dir / 'study.db'}")
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.set_user_attr("oracle_ic", {"train": 0.1, "valid": 0.08, "test": 0.075})
    rng = np.random.default_rng(seed)
    clock = dict.fromkeys(DEVICES, START)
    trials = [_trial(k, rng, clock) for k in range(n)]
    # one trial still running on the first slot, started 10 s ago; the history is shifted to end then
    shift = datetime.now().replace(microsecond=0) - timedelta(seconds=10) - clock[DEVICES[0]]
    for t in trials:
        t.datetime_start, t.datetime_complete = t.datetime_start + shift, t.datetime_complete + shift
    running = FrozenTrial(number=n, trial_id=n, state=TrialState.RUNNING, value=None, values=None,
                          datetime_start=clock[DEVICES[0]] + shift, datetime_complete=None, params={},
                          distributions={}, user_attrs={"device": DEVICES[0], "host": "bench", "driver_id": "d0"}, system_attrs={},
                          intermediate_values={1: 0.001})
    _bulk_add(storage, study._study_id, [*trials, running])
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    valid_dates = pd.bdate_range("2023-01-02", periods=VALID_DATES)
    test_dates = pd.bdate_range(valid_dates[-1] + pd.Timedelta(days=10), periods=TEST_DATES)
    for t in trials:
        if (t.number < n_daily or t.number == best.number) and t.state != TrialState.FAIL:
            out = run_dir / "trials" / str(t.number)
            out.mkdir(parents=True, exist_ok=True)
            _daily(out / "daily_ic_valid.csv", t.user_attrs["val_ic"], valid_dates, rng)
            _daily(out / "daily_ic_test.csv", t.user_attrs["test_ic"], test_dates, rng)
    return study_file
