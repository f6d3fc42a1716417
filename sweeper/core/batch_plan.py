"""The batch plan chosen before training (:func:`sweeper.core.step.plan_stack` probes it), and
halving the micro-batch after an OOM."""

import math
from dataclasses import dataclass

from sweeper.errors import OutOfMemory

AUTO_PROBE_START = 512  # first size tried for batch_size: auto (then doubling)
EVAL_SPLITS = ("valid", "test")  # what the loop evaluates: per epoch, then at the end


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int          # rows behind one optimizer step
    micro_batch: int         # rows per forward/backward
    eval_batch_size: int     # rows per evaluation forward
    peak_mem_mb: float = math.nan  # the probe's device peak (allocated) at these sizes; NaN: not probed
    note: str = ""           # what the probe did, for the log


def shrink_micro(micro: int, minimum: int, batch_size: int, date_rows: int = 1) -> int:
    """The micro-batch after an OOM: half, down to ``train.min_micro_batch``; with the IC loss
    (``date_rows`` > 1) no smaller than the largest date, which one micro-batch must hold whole."""
    if (smaller := micro // 2) < min(minimum, batch_size):
        raise OutOfMemory(f"out of memory at micro-batch {micro}; halving it would go below "
                          f"train.min_micro_batch={minimum}")
    if smaller < date_rows:
        if micro > date_rows:
            return date_rows
        raise OutOfMemory(f"out of memory at micro-batch {micro}; it cannot shrink: the IC loss keeps each "
                          f"date's rows in one micro-batch and the largest date of the training split has "
                          f"{date_rows} rows (train.loss: mse can split a date; or fewer assets, or more "
                          "memory)")
    return smaller
