"""The training core: K >= 1 training runs of one model shape trained as one stack on one device,
each scored on valid and test.

No Optuna, no store, no CLI: the sweep drives it through :class:`EpochHook` and
:class:`Checkpointer`. One concept per module:

- :mod:`~sweeper.core.loop`: ``train_stack``, the top-to-bottom loop (``train``: a stack of one);
- :mod:`~sweeper.core.lanes`: a stack's members, and what the loop keeps per member;
- :mod:`~sweeper.core.step`: one optimizer step of the stack, and the probe that plans its batch;
- :mod:`~sweeper.core.optim`: the flat per-member AdamW, clipping and loss scaling;
- :mod:`~sweeper.core.stack_size`: the stack size (and a CPU's precision) measured on the device, and the
  rules that choose them;
- :mod:`~sweeper.core.eval_batch`: the rows per evaluation forward measured on a CPU;
- :mod:`~sweeper.core.host_cache`: what a host keeps of those measurements, per shape;
- :mod:`~sweeper.core.hooks`: the hook and checkpointer protocols and their null objects;
- :mod:`~sweeper.core.checkpoint`: the checkpoint format, its one file, resume checks;
- :mod:`~sweeper.core.batch_plan`: the batch plan, halving the micro-batch after an OOM;
- :mod:`~sweeper.core.batch_search`: the search for the micro-batch that fits, OOM detection;
- :mod:`~sweeper.core.precision`: ``train.precision`` to autocast dtype, and where ``auto`` is measured;
- :mod:`~sweeper.core.loss`: ``train.loss`` to the loss's value and how it splits a batch;
- :mod:`~sweeper.core.schedule`: torch's AdamW, the learning-rate schedule, an epoch's batches;
- :mod:`~sweeper.core.evaluate`: predictions, per-epoch validation scores, final scores;
- :mod:`~sweeper.core.progress`: what the loop carries from epoch to epoch;
- :mod:`~sweeper.core.device`: device choice, seeding, and the memory a trial is measured by."""

from sweeper.core.checkpoint import FileCheckpointer, checkpoint_epoch, copy_checkpoint
from sweeper.core.device import resolve_device
from sweeper.core.evaluate import predict, predict_rows
from sweeper.core.hooks import Checkpointer, EpochHook, NullCheckpointer, NullHook
from sweeper.core.lanes import Member
from sweeper.core.loop import TrainResult, train, train_stack

__all__ = ["Checkpointer", "EpochHook", "FileCheckpointer", "Member", "NullCheckpointer", "NullHook",
           "TrainResult", "checkpoint_epoch", "copy_checkpoint", "predict", "predict_rows", "resolve_device",
           "train", "train_stack"]
