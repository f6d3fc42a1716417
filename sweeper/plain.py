"""A value in its stored JSON form: the one home of the rule. NaN and infinities become null
(JSON has neither, and one NaN must not cost ``--json`` its output), numpy and torch scalars
become Python numbers, and lists (a trial's per-fold figures) are converted item by item."""

import math
from typing import Any


def plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (dict, str, bytes)):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value
