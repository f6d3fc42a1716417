"""How much of the oracle's IC a trial reached: its IC over the IC of the label's own noiseless
signal on the same dates (the synthetic panel's ``oracle_ic``, or a Parquet file's metadata).
In a module of its own: the driver's live view shows it and imports neither pandas nor torch."""

from typing import Any


def oracle_fractions(attrs: dict[str, Any], oracle: dict[str, float] | None) -> dict[str, float]:
    """``{"val_ic_oracle_fraction", "test_ic_oracle_fraction"}`` of a trial's user attributes,
    each where the trial has the IC and the oracle a non-zero figure for its split."""
    return {f"{key}_oracle_fraction": attrs[key] / oracle[split]
            for split, key in (("valid", "val_ic"), ("test", "test_ic"))
            if oracle and oracle.get(split) and attrs.get(key) is not None}
