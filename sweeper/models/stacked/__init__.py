"""Every model as a stack: K >= 1 members of one shape as one module with a leading K dimension
(a run of one model is the stack of one).

- :mod:`~sweeper.models.stacked.base`: the contract (one-member names), the member-wise layers,
  the stacks of one (``OneMember``, ``SoloStack``);
- :mod:`~sweeper.models.stacked.mlp`, :mod:`~sweeper.models.stacked.recurrent`,
  :mod:`~sweeper.models.stacked.transformer`: the built-in models, each written once;
- :mod:`~sweeper.models.stacked.func`: a user's ``module:Class`` stacked through ``torch.func``;
- :mod:`~sweeper.models.stacked.build`: a stack from K one-member models, and how a config stacks."""
