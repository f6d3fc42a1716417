"""Quant figures: IC, Rank IC and ICIR as Qlib defines them, ranking, and the statistics
of selecting the best of many trials. Pure numpy / pandas / torch: no Optuna, no store.

- :mod:`~sweeper.quant.ic`: daily Pearson IC and Rank IC, their means and ICIR (Qlib's);
- :mod:`~sweeper.quant.ranks`: average ranks within a row, the package's one ranking;
- :mod:`~sweeper.quant.hac`: Newey-West standard errors of a mean of overlapping days;
- :mod:`~sweeper.quant.ic_time`: IC through time (years, months) and within groups;
- :mod:`~sweeper.quant.oracle`: the fraction of the oracle's IC a trial reached;
- :mod:`~sweeper.quant.portfolio`: the long-short view: quantile buckets, top minus bottom;
- :mod:`~sweeper.quant.ensemble`: ensembles of prediction frames;
- :mod:`~sweeper.quant.selection`: selection-bias statistics of the best of many trials."""
