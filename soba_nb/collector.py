"""Pausing Python's cyclic garbage collector around bulk allocations.

Loading a transcript or assembling the model input of a long path allocates many objects
that all stay alive (entries, messages). Each generation-2 collection rescans everything
alive, and such bursts trigger them again and again (at 300k entries most of the time spent
building the model input went to the collector). These objects hold no reference cycles,
so nothing is lost: collection resumes right after, and reference counting frees garbage
as usual meanwhile.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (left as it was: a caller that disabled it
    keeps it disabled)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
