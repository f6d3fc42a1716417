"""sweeper: hyperparameter sweeps for deep-learning alpha models.

The flow, one floor per package (docs/architecture.md): :mod:`sweeper.config` (the study file, validated
once) -> :mod:`sweeper.dispatch` (the driver) -> :mod:`sweeper.worker` (the child) ->
:mod:`sweeper.validation` (a trial's runs) -> :mod:`sweeper.core` (the training loop, on
:mod:`sweeper.data` and :mod:`sweeper.models`) -> :mod:`sweeper.quant` (the figures) ->
:mod:`sweeper.store` (where everything is kept) -> :mod:`sweeper.inspect` (what a user reads);
:mod:`sweeper.study` holds the rules over the stored study that several floors read, :mod:`sweeper.devices`
the GPUs and slots, :mod:`sweeper.baseline` the LightGBM baseline. The modules at the top:

- :mod:`~sweeper.cli`: the ``sweeper`` command line, a thin click shell;
- :mod:`~sweeper.train_command`: ``sweeper train``, one trial's runs without a sweep;
- :mod:`~sweeper.refit`: ``sweeper refit``, a trial retrained on every labelled date;
- :mod:`~sweeper.launch` and :mod:`~sweeper.child`: how the driver starts a child, and what every
  child does first;
- :mod:`~sweeper.interrupt`: the stop token of one sweep;
- :mod:`~sweeper.errors`: the domain errors the CLI maps to exit code 2;
- :mod:`~sweeper.atomic`: atomic file writes;
- :mod:`~sweeper.plain`: a value in its stored JSON form."""

__version__ = "0.1.0"
