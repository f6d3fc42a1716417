"""Temporary, for sweeper/core/evaluate.py alone until it imports sweeper.core.batch_search
(issue 19 renamed this module); delete this file then."""
from sweeper.core.batch_search import is_oom, release_memory

__all__ = ["is_oom", "release_memory"]
