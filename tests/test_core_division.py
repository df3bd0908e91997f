"""The division of the cores among runners (scheduler/cores.py), rule by rule."""

from __future__ import annotations

from ollamatrio.scheduler.cores import CoreClaim, divide


def claim(
    key: str, *, pool: int = 8, fixed: int = 0, generating: bool = False, on_gpu: bool = False
) -> CoreClaim:
    return CoreClaim(key=key, pool=pool, fixed=fixed, generating=generating, on_gpu=on_gpu)


def test_a_runner_alone_has_every_core_whether_generating_or_not():
    assert divide(8, [claim("a")]) == {"a": 8}
    assert divide(8, [claim("a", generating=True)]) == {"a": 8}


def test_runners_generating_divide_the_cores_the_first_taking_the_odd_one():
    claims = [claim(k, generating=True) for k in "abc"]
    assert divide(8, claims) == {"a": 3, "b": 3, "c": 2}
    assert divide(2, claims[:2]) == {"a": 1, "b": 1}


def test_more_runners_than_cores_get_one_thread_each():
    assert divide(2, [claim(k, generating=True) for k in "abc"]) == {"a": 1, "b": 1, "c": 1}


def test_an_idle_runner_gets_what_it_would_if_it_started_now():
    claims = [claim("a", generating=True), claim("b"), claim("c")]
    assert divide(8, claims) == {"a": 8, "b": 4, "c": 4}
    assert divide(8, [claim("a"), claim("b")]) == {"a": 8, "b": 8}  # nothing generates


def test_a_share_never_exceeds_the_runners_pool():
    claims = [claim("a", pool=2, generating=True), claim("b", pool=16, generating=True)]
    assert divide(16, claims) == {"a": 2, "b": 8}


def test_a_fixed_count_generating_is_taken_off_the_cores_and_never_told():
    claims = [claim("a", pool=0, fixed=6, generating=True), claim("b", generating=True)]
    assert divide(8, claims) == {"b": 2}
    idle_fixed = [claim("a", pool=0, fixed=6), claim("b", generating=True)]
    assert divide(8, idle_fixed) == {"b": 8}


def test_a_runner_on_gpus_keeps_its_pool_alone_and_one_thread_beside_cpu_work():
    gpu = claim("g", on_gpu=True, generating=True)
    assert divide(8, [gpu]) == {"g": 8}
    assert divide(8, [gpu, claim("a", generating=True)]) == {"g": 1, "a": 8}
    assert divide(8, [gpu, claim("a")]) == {"g": 8, "a": 8}
