"""A module that breaks the fork server's rules at import, as ``FORK_UNSAFE`` (comma-separated)
names them: ``tensor`` (a tensor op), ``threads`` (torch's thread settings), ``thread`` (a
thread of its own), ``cuda`` (a CUDA context). tests/test_fork_safety.py preloads it."""
from __future__ import annotations

import os
import threading
import time

import torch

BROKEN = os.environ.get("FORK_UNSAFE", "").split(",")
if "tensor" in BROKEN:
    torch.zeros(3)
if "threads" in BROKEN:
    torch.set_num_threads(torch.get_num_threads() + 1)
    torch.set_num_interop_threads(torch.get_num_interop_threads() + 1)
if "thread" in BROKEN:
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
if "cuda" in BROKEN:
    torch.cuda.init()
