"""The sweep: the driver (parent process) and the workers (child processes) it runs.

Parent, the only side that asks Optuna for trials or starts processes:
- :mod:`~sweeper.sweep.run`: ``sweeper run`` / ``resume`` / ``validate`` / ``db init``: checks, set-up, cleanup;
- :mod:`~sweeper.sweep.driver`: the dispatch loop over worker slots, signals, time limits;
- :mod:`~sweeper.sweep.handle`: one worker subprocess and its pipe;
- :mod:`~sweeper.sweep.claim`: counting the budget and asking for a trial, under the claim lock;
- :mod:`~sweeper.sweep.retries`: failing stale trials and queueing retries;
- :mod:`~sweeper.sweep.study`: creating or joining a study, refusing config drift;
- :mod:`~sweeper.sweep.identity`: which host and driver runs a trial;
- :mod:`~sweeper.sweep.space`: ``search_space`` -> Optuna suggestions;
- :mod:`~sweeper.sweep.telemetry`: the GPU sampling thread.

Child (``python -m sweeper.sweep.worker``), which never imports the parent's modules:
- :mod:`~sweeper.sweep.worker`: the worker process's main loop and command reader;
- :mod:`~sweeper.sweep.runner`: one trial's life: attach, train with the core, record, finish;
- :mod:`~sweeper.sweep.trial_hook`: the core's epoch hook that reports to Optuna and the driver;
- :mod:`~sweeper.sweep.heartbeat`: the trial's heartbeat thread.

Both sides:
- :mod:`~sweeper.sweep.protocol`: the JSON-lines messages between driver and worker;
- :mod:`~sweeper.sweep.samplers`: sampler and pruner construction from the config.

This ``__init__`` imports nothing, so a worker that imports a child module loads no parent code.
"""
