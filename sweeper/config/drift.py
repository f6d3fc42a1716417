"""Config drift: which dotted keys of a stored config differ from the current one.

Two rules use it: a resumed study refuses a study file whose data, model, training or search space changed
(:data:`STUDY_SECTIONS`), and a checkpoint only continues the run that wrote it (:data:`CHECKPOINT_SECTIONS`).
"""

import contextlib
from typing import Any

from pydantic import ValidationError

from sweeper.config.dotted import flatten, to_dict
from sweeper.config.schema import SweeperConfig

# study.constraints too: they decide which trials are feasible (the best), and Optuna's GP
# sampler refuses trials with different constraint counts in one study
STUDY_SECTIONS = ("data.", "model.", "train.", "search_space", "study.metric", "study.direction",
                  "study.constraints", "validation.")
CHECKPOINT_SECTIONS = ("model.", "train.", "data.")
# where the data file and the panel cache lie and how much of the panel sits on the device change
# nothing a trial computes (the data fingerprint, compared on its own, says whether the data is
# the same; the study file read from another folder names the same file by another path);
# nor does how its runs are stacked (a member is its lone run; on a GPU, dropout masks aside): a
# stack's checkpoint names its runs, so one of another stacking is never continued (validation.runner);
# nor how many rows an evaluation forward takes (the last bits of a prediction; a checkpoint's run
# goes on with its own, and auto's measured size may differ between hosts)
NOT_DRIFT = frozenset({"data.path", "data.cache", "data.cache_dir", "data.cache_max_gb", "data.device_share",
                       "train.max_stack", "train.eval_batch_size"})


def differing_keys(stored: dict[str, Any], current: dict[str, Any],
                   prefixes: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, stored value, current value)`` for every key under ``prefixes`` that differs, sorted."""
    # an empty section ({}: no constraints) is no key: a bound added shows as its own key, not as {} going
    old, new = ({k: v for k, v in flatten(c).items() if v != {}} for c in (stored, current))
    keys = sorted(k for k in set(old) | set(new) if k.startswith(prefixes) and k not in NOT_DRIFT)
    return [(k, old.get(k, "<unset>"), new.get(k, "<unset>")) for k in keys if old.get(k) != new.get(k)]


def drift(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ in the parts of the config a resume may not change.

    The stored config is read through today's schema first, so that a key added by a
    newer sweeper (absent from a study created before it) counts only if the study
    file sets it to something other than its default."""
    with contextlib.suppress(ValidationError):  # a key this version no longer knows: compare as stored
        stored = to_dict(SweeperConfig.model_validate(stored))
    old, new = (set(c.get("search_space") or {}) for c in (stored, current))  # a param is one line
    whole = {f"search_space.{p}": how for params, how in ((old - new, "removed"), (new - old, "added"))
             for p in params}
    return sorted([f"{p} ({how})" for p, how in whole.items()] + [
        f"{k} ({a!r} -> {b!r})" for k, a, b in differing_keys(stored, current, STUDY_SECTIONS)
        if not k.startswith(tuple(p + "." for p in whole))])
