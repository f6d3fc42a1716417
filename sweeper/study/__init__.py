"""Rules over the stored study that the parent, the worker and ``inspect`` all read. It imports
neither :mod:`sweeper.dispatch` nor :mod:`sweeper.worker` (``tests/test_architecture.py``).

- :mod:`~sweeper.study.open`: creating or joining a study, refusing config drift;
- :mod:`~sweeper.study.summary`: what the study records of its panel;
- :mod:`~sweeper.study.stacking`: the study's stack size: pinned, or its first trial's measurement;
- :mod:`~sweeper.study.samplers` and :mod:`~sweeper.study.space`: sampler and pruner from the
  config, ``search_space`` -> Optuna suggestions;
- :mod:`~sweeper.study.warm_start`: the parameter sets a new study runs first;
- :mod:`~sweeper.study.ending`: how a trial ends in the store (its reason, then its state);
- :mod:`~sweeper.study.retry_rule`: which failed trials deserve another go (a pure rule);
- :mod:`~sweeper.study.retention`: ``study.keep``: which finished trials' files go;
- :mod:`~sweeper.study.convergence`: the Terminator's evaluators over the fold scores.

This ``__init__`` imports nothing."""
