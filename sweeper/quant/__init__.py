"""Quant figures: IC, Rank IC and ICIR as Qlib defines them, ranking, and the statistics
of selecting the best of many trials. Pure numpy / pandas / torch: no Optuna, no store."""
