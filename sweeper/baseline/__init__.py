"""The LightGBM baseline of a study (docs/baseline.md): a gradient-boosted model trained on
exactly the study's train rows, features and label normalisation, early-stopped on its valid
split and scored on valid and test with the trials' IC code, so ``sweeper best`` can say how
much the sweep's best trial adds over it.

- :mod:`~sweeper.baseline.features`: the design matrix of a split's rows (each row's features at
  its date plus ``baseline.lags`` earlier dates);
- :mod:`~sweeper.baseline.fit`: the LightGBM fit, its predictions and their IC;
- :mod:`~sweeper.baseline.job`: running it for a study (files, study attributes, once per study);
- :mod:`~sweeper.baseline.compare`: the best trial against it (daily IC difference, Newey-West t).
"""
