"""The child: one worker process (``python -m sweeper.worker.main``) pinned to a device slot,
training the trials it is handed. It never imports :mod:`sweeper.dispatch`
(``tests/test_architecture.py`` checks it statically and in a real worker).

- :mod:`~sweeper.worker.main`: the worker process's main loop and command reader;
- :mod:`~sweeper.worker.forked`: the fork server: imports once what its children need, forks them;
- :mod:`~sweeper.worker.trial`: one trial's life: attach, train its runs, record, finish;
- :mod:`~sweeper.worker.hook`: the core's epoch hook that reports to Optuna and the driver;
- :mod:`~sweeper.worker.heartbeat`: the trial's heartbeat thread;
- :mod:`~sweeper.worker.adoption`: which checkpoint a trial may continue (its owner stamp);
- :mod:`~sweeper.worker.constraints`: ``study.constraints``: the figures and Optuna's constraint values;
- :mod:`~sweeper.worker.protocol`: the JSON-lines messages between driver and worker (the driver
  reads it too).

This ``__init__`` imports nothing, so importing one module loads only what that module needs."""
