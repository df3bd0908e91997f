"""The open file limit a runner runs under: the one the server started with.

The server raises its own soft ``RLIMIT_NOFILE`` to the hard limit for its client
connections (:func:`ollamatrio.http.budget.raise_open_file_limit`), as Go's runtime does,
and, as Go does for the programs it starts, gives its children the limit it had before:
a runner keeps a few descriptors open, and libraries that size tables by the limit or still
use ``select()`` are better off with the usual one.  The value travels in the environment,
so a spare runner started before any load gets it too.
"""

from __future__ import annotations

import contextlib
import os
import resource

CHILD_LIMIT_ENV = "OLLAMATRIO_CHILD_NOFILE"


def remember_for_children(soft: int) -> None:
    """Record ``soft``, the limit before raising it, for every child started from now on."""
    os.environ[CHILD_LIMIT_ENV] = str(soft)


def restore_inherited_limit() -> None:
    """Lower this process's soft limit to the recorded one (nothing recorded, a value that
    is not a number or not below the current soft limit: unchanged)."""
    text = os.environ.pop(CHILD_LIMIT_ENV, "")
    with contextlib.suppress(ValueError, OSError):
        wanted = int(text)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if wanted > 0 and (soft == resource.RLIM_INFINITY or wanted < soft):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
