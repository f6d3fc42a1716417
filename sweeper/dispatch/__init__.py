"""The parent: the sweep's driver and everything only it does (ask Optuna for trials, start
processes, decide who runs what and when the sweep stops).

- :mod:`~sweeper.dispatch.run`: ``sweeper run`` / ``resume`` / ``validate`` / ``db init``: checks,
  set-up, cleanup;
- :mod:`~sweeper.dispatch.plan`: what the checks found, carried to the rest;
- :mod:`~sweeper.dispatch.driver`: the dispatch loop over worker slots, events, time limits;
- :mod:`~sweeper.dispatch.strategies`: which worker takes the next trial: one per slot, or packed;
- :mod:`~sweeper.dispatch.packer`: the packing strategy's state: NVML readings, charges, held trials;
- :mod:`~sweeper.dispatch.stopping`: whether the sweep stops, and why; its result and exit code;
- :mod:`~sweeper.dispatch.handle`: one worker subprocess, its pipes and the trial it runs;
- :mod:`~sweeper.dispatch.forkserver`: the driver's side of the worker fork server;
- :mod:`~sweeper.dispatch.claim`: counting the budget and asking for a trial, under the claim lock;
- :mod:`~sweeper.dispatch.retries`: failing stale trials and queueing retries;
- :mod:`~sweeper.dispatch.baseline_job`: the LightGBM baseline as a job on a free worker slot;
- :mod:`~sweeper.dispatch.view` and :mod:`~sweeper.dispatch.live`: the live view's protocol (worker
  warnings through it, repeats held back), and the views (rich, plain lines, nothing).

It may import :mod:`sweeper.worker` (the protocol it speaks) and :mod:`sweeper.study`; neither
imports it (``tests/test_architecture.py``)."""
