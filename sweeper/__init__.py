"""sweeper: hyperparameter sweeps for deep-learning alpha models."""
from __future__ import annotations

__version__ = "0.1.0"
