"""Stacked models: K members of one shape as one module with a leading K dimension.

- :mod:`~sweeper.models.stacked.base`: the contract (one-member names), stacked linear and dropout;
- :mod:`~sweeper.models.stacked.mlp`, :mod:`~sweeper.models.stacked.recurrent`,
  :mod:`~sweeper.models.stacked.transformer`: the built-in models, stacked natively;
- :mod:`~sweeper.models.stacked.build`: a stack from K one-member models, and which configs stack.
"""
