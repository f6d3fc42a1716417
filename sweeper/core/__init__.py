"""The training core: one trial's model trained on one device, scored on valid and test.

No Optuna, no store, no CLI: the sweep drives it through :class:`EpochHook` and
:class:`Checkpointer`. One concept per module:

- :mod:`~sweeper.core.loop`: ``train``, the top-to-bottom loop, and ``TrainResult``;
- :mod:`~sweeper.core.hooks`: the hook and checkpointer protocols and their null objects;
- :mod:`~sweeper.core.checkpoint`: the checkpoint format, its one file (which names its epoch),
  resume checks;
- :mod:`~sweeper.core.step`: one optimizer step's forward and backward over micro-batches;
- :mod:`~sweeper.core.batch_plan`: the batch plan (batch, micro-batch, evaluation batch) chosen before
  training, halving the micro-batch after an OOM;
- :mod:`~sweeper.core.batch_search`: the probe's search for the micro-batch that fits in free memory,
  OOM detection;
- :mod:`~sweeper.core.precision`: ``train.precision`` to autocast dtype and gradient scaler;
- :mod:`~sweeper.core.loss`: ``train.loss`` to the loss's value and how it splits a batch;
- :mod:`~sweeper.core.schedule`: the optimizer, the learning-rate schedule, an epoch's batches;
- :mod:`~sweeper.core.evaluate`: predictions, per-epoch validation scores, final scores;
- :mod:`~sweeper.core.progress`: what the loop carries from epoch to epoch;
- :mod:`~sweeper.core.device`: device choice, seeding, and the memory a trial is measured by
  (``train(memory=...)``: the batch probe's reader and the peaks reported).
"""
from __future__ import annotations

from sweeper.core.checkpoint import FileCheckpointer, checkpoint_epoch, copy_checkpoint
from sweeper.core.device import resolve_device
from sweeper.core.evaluate import predict, predict_rows
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer, NullHook
from sweeper.core.loop import TrainResult, train

__all__ = [
    "Checkpointer", "EpochHook", "FileCheckpointer", "NullCheckpointer", "NullHook", "TrainResult",
    "checkpoint_epoch", "copy_checkpoint", "predict", "predict_rows", "resolve_device", "train",
]
