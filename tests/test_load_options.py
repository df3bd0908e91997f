"""Load-time options: the context-shift choice (the request's ``shift``, else the model's
default: on, off for deepseek2) and the reload a different choice causes."""

from __future__ import annotations

from dataclasses import replace

from ollamatrio.scheduler.options import needs_reload, resolve_load_options


def resolve(shift: bool | None = None, architecture: str = "llama"):  # type: ignore[no-untyped-def]
    return resolve_load_options(
        {}, default_num_ctx=4096, context_length_configured=False, train_ctx=8192,
        num_parallel=1, embedding_only=False, architecture=architecture, shift=shift,
    )  # fmt: skip


def test_context_shift_is_on_unless_asked_off_or_deepseek2() -> None:
    assert resolve().context_shift
    assert not resolve(shift=False).context_shift
    assert not resolve(architecture="deepseek2").context_shift
    assert resolve(shift=True, architecture="deepseek2").context_shift


def test_a_different_shift_choice_reloads() -> None:
    loaded = resolve()
    assert not needs_reload(loaded, resolve(shift=None))
    assert not needs_reload(loaded, resolve(shift=True))
    assert needs_reload(loaded, resolve(shift=False))
    assert needs_reload(replace(loaded, context_shift=False), resolve())
