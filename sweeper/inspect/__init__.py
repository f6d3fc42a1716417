"""Inspecting a study, during or after its sweep. No imports here, so that importing
``sweeper.inspect`` costs nothing; import the module you need:

- :mod:`~sweeper.inspect.results`: status and best-trial reports, daily IC files, selection bias;
- :mod:`~sweeper.inspect.printing`: ``sweeper status`` / ``sweeper best`` printed with rich;
- :mod:`~sweeper.dispatch.live`: the live view while a sweep runs (rich, plain lines or nothing);
- :mod:`~sweeper.inspect.report`: ``sweeper report``, the self-contained HTML page;
- :mod:`~sweeper.inspect.figures_base`: the study data and layout the report's figures share;
- :mod:`~sweeper.inspect.figures_search`: report figures 1-4 (history, importances, parallel, curves);
- :mod:`~sweeper.inspect.figures_devices`: report figure 5 (trials per slot, utilisation, GPU telemetry);
- :mod:`~sweeper.inspect.figures_ic`: report figures 6-8, 12 and 13 (valid vs test IC, daily IC, selection
  bias, the best trial against the LightGBM baseline, fold ICs of the top trials);
- :mod:`~sweeper.inspect.figures_portfolio`: report figures 9-10 (bucket means, cumulative long-short);
- :mod:`~sweeper.inspect.figures_time`: report figure 11 (mean daily IC by year and month);
- :mod:`~sweeper.inspect.longshort`: the long-short view and the top-K ensemble beside the best trial;
- :mod:`~sweeper.inspect.ic_views`: IC by year and group-neutral IC of the best trial and the baseline;
- :mod:`~sweeper.inspect.trials`: a stored trial read back without torch (its config, its files);
- :mod:`~sweeper.inspect.frames`: the trials' stored prediction frames, for best and the report;
- :mod:`~sweeper.inspect.trial_model`: a trial's model rebuilt and applied (the Predictor);
- :mod:`~sweeper.inspect.predict`: ``sweeper predict``, a trial's weights applied to a split or a file;
- :mod:`~sweeper.inspect.export`: ``sweeper export``, one row per trial to Parquet or CSV;
- :mod:`~sweeper.inspect.dashboard`: ``sweeper dashboard``, optuna-dashboard over the study;
- :mod:`~sweeper.inspect.doctor`: ``sweeper doctor``, what this machine offers a sweep."""
