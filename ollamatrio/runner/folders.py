"""Runners' private folders in the temporary directory, and the sweep of stale ones.

Each runner gets a 0700 folder ``ollamatrio-runner-*`` (its socket and load log).  The
runner removes it on every exit path that runs code, and the server removes it when it
reaps the runner; a runner killed outright together with its server leaves it behind.

Ownership is a lock, not a pid: the folder holds ``owner.lock``, which the server locks
(``flock``) before the runner starts and hands to the runner as an inherited descriptor.
The kernel drops the lock when the last process holding it is gone, however it died, so
a folder whose lock can be taken is provably stale (no pid-reuse guesses), and a live
server's or runner's folder never is.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile

log = logging.getLogger(__name__)

PREFIX = "ollamatrio-runner-"
OWNER_LOCK = "owner.lock"
SOCKET_NAME = "llama.sock"
# A Unix socket's path must fit ``sockaddr_un.sun_path`` (108 bytes on Linux, NUL included).
_SUN_PATH_MAX = 107
_FOLDER_NAME_LEN = len(PREFIX) + 8  # mkdtemp's random part is 8 characters
_FALLBACK_TEMP = "/tmp"


def runner_temp_dir() -> str:
    """Where runner folders go: the temporary directory, unless a socket inside it would be
    too long to bind (a deep ``TMPDIR``, as pytest's or some sandboxes' are); then ``/tmp``.
    llama.cpp reports an over-long socket path only as "couldn't bind"."""
    for candidate in (tempfile.gettempdir(), _FALLBACK_TEMP):
        if _socket_path_len(candidate) <= _SUN_PATH_MAX:
            return candidate
    raise OSError(
        f"the temporary directory {tempfile.gettempdir()!r} is too deep for a runner's "
        f"socket path ({_SUN_PATH_MAX} bytes at most); set TMPDIR to a shorter one"
    )


def _socket_path_len(temp_dir: str) -> int:
    return len(os.fsencode(os.path.join(temp_dir, "x" * _FOLDER_NAME_LEN, SOCKET_NAME)))


def make_runner_folder() -> tuple[str, int]:
    """A new private folder and a descriptor holding the lock on its owner file (blocking).

    The caller passes the descriptor to the runner (``pass_fds``) and closes its own copy
    after removing the folder.  The lock file appears under its final name only once it is
    locked, so a sweep never sees it unlocked while its owner lives."""
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=runner_temp_dir())  # mode 0700
    staging = os.path.join(folder, ".owner.lock")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, os.path.join(folder, OWNER_LOCK))
    except BaseException:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, fd


def remove_stale_runner_folders(temp_dir: str | None = None) -> int:
    """Remove the runner folders in ``temp_dir`` (default: :func:`runner_temp_dir`) that
    belong to this user and that no live process owns; returns how many (blocking).

    A folder without an owner lock (made by an older version) is left alone: nothing
    proves it stale."""
    temp_dir = temp_dir or runner_temp_dir()
    uid = os.getuid()
    removed = 0
    try:
        entries = list(os.scandir(temp_dir))
    except OSError as exc:
        log.warning("cannot look for stale runner folders in %s: %s", temp_dir, exc)
        return 0
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if _remove_if_unowned(entry.path):
            removed += 1
    if removed:
        log.info("removed %d stale runner folders from %s", removed, temp_dir)
    return removed


def _remove_if_unowned(folder: str) -> bool:
    try:
        fd = os.open(os.path.join(folder, OWNER_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no owner lock: not provably stale
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: a live server or runner owns it
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(fd)
