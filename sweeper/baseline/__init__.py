"""The LightGBM baseline of a study (docs/baseline.md): a gradient-boosted model trained on exactly the
study's train rows, features and label normalisation, early-stopped on its valid split and scored on valid
and test with the trials' IC code, so ``sweeper best`` can say how much the sweep's best trial adds over it.

- :mod:`~sweeper.baseline.features`: the design matrix of a split's rows (each row's features at
  its date plus ``baseline.lags`` earlier dates);
- :mod:`~sweeper.baseline.fit`: the LightGBM fit, its predictions and their IC;
- :mod:`~sweeper.baseline.job`: running it for a study (its files and study attributes);
- :mod:`~sweeper.baseline.state`: its states (``baseline_state``), the one claim rule a sweep
  follows (once per study; an interrupted run may be claimed again) and the job's exit codes;
- :mod:`~sweeper.baseline.compare`: the best trial against it (daily IC difference, Newey-West t)."""
