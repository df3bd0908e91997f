"""The prompt cache's grant held by RLIMIT_DATA (engines/cache_allowance.py), on a real
child process that allocates private memory on demand, as llama.cpp's cache does: growth
is measured from the moment the allowance is taken, an allocation past the grant (plus the
headroom) fails without killing the process, and a grant of the whole limit lifts the cap."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from ollamatrio.engines.cache_allowance import HEADROOM, MiB, PromptCacheAllowance, open_allowance

CHILD = """
import sys
held = []
for line in sys.stdin:
    if line.strip() == "free":
        held.clear()
        print("freed", flush=True)
        continue
    try:
        held.append(bytearray(int(line) << 20))  # touched: zero-filled private memory
        print("ok", flush=True)
    except MemoryError:
        print("refused", flush=True)
"""
STEP = 16  # MiB an allocation


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def ask(proc: subprocess.Popen[str], line: str) -> str:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_a_grant_caps_growth_and_the_whole_limit_lifts_the_cap(
    child: subprocess.Popen[str],
) -> None:
    assert ask(child, "0") == "ok"  # started and ready
    cache = PromptCacheAllowance(child.pid, limit=1024 * MiB)
    assert cache.held() < MiB
    cache.grant(2 * STEP * MiB)
    steps = (HEADROOM // MiB + 2 * STEP) // STEP
    answers = [ask(child, str(STEP)) for _ in range(steps + 1)]
    assert answers[:-1] == ["ok"] * steps  # up to the grant and the headroom
    assert answers[-1] == "refused"  # past them: the allocation fails, the process lives
    # (The count is psutil's ``data``, the stack included, which the limit does not cover.)
    assert steps * STEP * MiB <= cache.held() <= HEADROOM + 2 * STEP * MiB + MiB
    assert ask(child, "free") == "freed"
    assert cache.held() < STEP * MiB  # freed states leave the count
    cache.grant(0)
    assert ask(child, str(HEADROOM // MiB + STEP)) == "refused"
    cache.grant(1024 * MiB)  # its whole limit: no cap
    assert ask(child, str(HEADROOM // MiB + STEP)) == "ok"
    assert cache.held() >= HEADROOM + STEP * MiB


def test_a_runner_that_is_gone_holds_nothing_and_takes_no_grant(
    child: subprocess.Popen[str],
) -> None:
    assert ask(child, "0") == "ok"
    cache = PromptCacheAllowance(child.pid, limit=64 * MiB)
    child.kill()
    child.wait()
    assert cache.held() == 0
    cache.grant(MiB)  # no error
    assert cache.granted == 64 * MiB  # nothing was capped
    assert open_allowance(child.pid, 64 * MiB) is None
