"""Whether a session dropped by a test is collected: the recording thread (runtime/session.py
_Recorder) lets go of its last job right after finishing it, so the test waits a little."""

from __future__ import annotations

import gc
import time
import weakref


def collected(ref: weakref.ref, tries: int = 200) -> bool:
    """True once ``ref``'s object is gone, collecting garbage up to ``tries`` times 10 ms apart."""
    for _ in range(tries):
        gc.collect()
        if ref() is None:
            return True
        time.sleep(0.01)
    return False
