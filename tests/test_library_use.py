"""sweeper as a library, from a notebook's process: a sweep run from Python (sweeper.dispatch.run)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from sweeper.config import load_config


@pytest.mark.slow
def test_a_sweep_run_from_a_thread_other_than_the_main_one(study_file):
    """A notebook's background sweep: signal handlers can only be set in the main thread (a bare
    ValueError from signal.signal before), so there the sweep leaves them to it."""
    from sweeper.dispatch.live import NullView
    from sweeper.dispatch.run import run

    path = study_file({"study": {"n_trials": 2}, "devices": {"cpu_workers": 1}})
    handler, out = signal.getsignal(signal.SIGINT), {}
    thread = threading.Thread(target=lambda: out.update(result=run(load_config(path), view=NullView())))
    thread.start()
    thread.join(timeout=120)
    assert out["result"].exit_code == 0 and out["result"].counts["COMPLETE"] == 2
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_config_changed_in_python_after_loading_is_checked_before_anything_is_written(study_file):
    """Attribute assignment is not validated: the study was created with the bad config, its workers refused
    it ("exited 3 times before it was ready") and the study's stored config stood in the way of a good one."""
    from sweeper.dispatch.live import NullView
    from sweeper.dispatch.run import run
    from sweeper.errors import ConfigError

    cfg = load_config(study_file())
    cfg.train.epochs = 0
    with pytest.raises(ConfigError) as exc:
        run(cfg, view=NullView())
    assert str(exc.value) == "study config: train.epochs: Input should be greater than or equal to 1 (got 0)"
    assert not Path("runs").exists()
