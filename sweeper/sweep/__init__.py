"""The sweep: the driver (parent process) and the workers (child processes) it runs.

Parent, the only side that asks Optuna for trials or starts processes:
- :mod:`~sweeper.sweep.run`: ``sweeper run`` / ``resume`` / ``validate`` / ``db init``: checks, set-up,
  cleanup;
- :mod:`~sweeper.sweep.plan`: what the checks found (the panel's summary among it), carried to the rest;
- :mod:`~sweeper.sweep.driver`: the dispatch loop over worker slots, events, time limits;
- :mod:`~sweeper.sweep.dispatch`: which worker takes the next trial: a trial per slot, or packed by memory;
- :mod:`~sweeper.sweep.packer`: the packing strategy's state: NVML readings, charges, held trials;
- :mod:`~sweeper.sweep.stopping`: whether the sweep stops, and why; the sweep's outcome and exit code;
- :mod:`~sweeper.sweep.handle`: one worker subprocess, its pipes and the trial it runs;
- :mod:`~sweeper.sweep.claim`: counting the budget and asking for a trial, under the claim lock;
- :mod:`~sweeper.sweep.retries`: failing stale trials and queueing retries;
- :mod:`~sweeper.sweep.study`: creating or joining a study, refusing config drift;
- :mod:`~sweeper.sweep.warm_start`: the parameter sets a new study runs first (warm start, the config's own,
  ``--enqueue``);
- :mod:`~sweeper.sweep.identity`: which host and driver runs a trial;
- :mod:`~sweeper.sweep.space`: ``search_space`` -> Optuna suggestions;
- :mod:`~sweeper.sweep.notices`: worker warnings through the view, repeats held back;
- :mod:`~sweeper.sweep.view`: the protocol every live view implements;
- :mod:`~sweeper.sweep.telemetry`: the GPU sampling thread.

Child (``python -m sweeper.sweep.worker``), which never imports the parent's modules:
- :mod:`~sweeper.sweep.worker`: the worker process's main loop and command reader;
- :mod:`~sweeper.sweep.worker_trial`: one trial's life: attach, train with the core, record, finish;
- :mod:`~sweeper.sweep.trial_hook`: the core's epoch hook that reports to Optuna and the driver;
- :mod:`~sweeper.sweep.heartbeat`: the trial's heartbeat thread;
- :mod:`~sweeper.sweep.adoption`: which checkpoint a trial may continue (its owner stamp).

Both sides:
- :mod:`~sweeper.sweep.protocol`: the JSON-lines messages between driver and worker;
- :mod:`~sweeper.sweep.outcome`: how a trial ends in the store (its reason, then its state);
- :mod:`~sweeper.sweep.samplers`: sampler and pruner construction from the config;
- :mod:`~sweeper.sweep.retry_rule`: which failed trials deserve another go (a pure rule);
- :mod:`~sweeper.sweep.retention`: ``study.keep``: which finished trials' files go (worker, ``sweeper gc``).

This ``__init__`` imports nothing, so a worker that imports a child module loads no parent code.
"""
