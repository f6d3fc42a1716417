"""One trial's training runs: its run grid (folds x seeds; one fold of one seed without
walk-forward folds or repeats), trained and scored on all of them (docs/walk-forward.md).

- :mod:`~sweeper.validation.grid`: the run grid, the one layout of a trial's runs;
- :mod:`~sweeper.validation.runner`: the loop over the grid, each run through
  :func:`sweeper.core.train`, with each finished run's files in ``runs/`` (resume skips them);
- :mod:`~sweeper.validation.run_files`: where a trial's runs keep their files (a retry skips the finished);
- :mod:`~sweeper.validation.population`: several trials of one shape in one stack, each its own trial;
- :mod:`~sweeper.validation.scores`: the aggregation into the objective and the user attributes;
- :mod:`~sweeper.validation.record`: what the trial leaves: value, attributes, files;
- :mod:`~sweeper.validation.contract`: the fold attributes' names, and whether a study is folded.

This ``__init__`` imports nothing: the grid and the contract are read by commands that must not
import torch (``best``, ``status``), the runner is not."""
