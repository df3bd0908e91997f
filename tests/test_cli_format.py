"""The CLI's wording and layout: sizes, times, durations, tables, show, timings, progress."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest

from ollamatrio.cli import _keep_alive, _normalise, _think, main
from ollamatrio.cli.client import CLIError
from ollamatrio.cli.commands import show_info
from ollamatrio.cli.humanize import (
    go_duration,
    human_bytes,
    human_number,
    human_time,
    parse_time,
    processor,
    render_table,
    until,
)
from ollamatrio.cli.progress import Progress, StatusRenderer, short_status
from ollamatrio.cli.run import ResponseWriter, summary

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1 KB"),
        (1500, "1.5 KB"),
        (10_400, "10 KB"),
        (98_362_432, "98 MB"),
        (2_000_000_000, "2 GB"),
        (2_500_000_000, "2.5 GB"),
        (4_700_000_000_000, "4.7 TB"),
    ],
    ids=lambda v: str(v),
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (999, "999"),
        (7_400, "7K"),
        (1_500_000, "1.50M"),
        (134_515_008, "134.52M"),
        (135_000_000, "135M"),
        (1_240_000_000, "1.2B"),
        (8_000_000_000, "8B"),
    ],
    ids=lambda v: str(v),
)
def test_human_number(n: int, text: str) -> None:
    assert human_number(n) == text


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (timedelta(seconds=-0.5), "Less than a second ago"),
        (timedelta(seconds=-1), "1 second ago"),
        (timedelta(seconds=-42), "42 seconds ago"),
        (timedelta(seconds=-90), "About a minute ago"),
        (timedelta(minutes=-2, seconds=-5), "2 minutes ago"),
        (timedelta(minutes=-70), "About an hour ago"),
        (timedelta(hours=-5), "5 hours ago"),
        (timedelta(days=-3), "3 days ago"),
        (timedelta(days=-20), "2 weeks ago"),
        (timedelta(days=-100), "3 months ago"),
        (timedelta(days=-800), "2 years ago"),
        (timedelta(minutes=4, seconds=59), "4 minutes from now"),
        (timedelta(hours=30), "30 hours from now"),
        (timedelta(days=365 * 292), "Forever"),
    ],
    ids=lambda v: str(v),
)
def test_human_time(offset: timedelta, text: str) -> None:
    assert human_time(NOW + offset, "Never", NOW) == text


def test_human_time_zero_value() -> None:
    assert human_time(None, "Never", NOW) == "Never"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T12:00:00Z", datetime(2026, 11, 22, 12, tzinfo=UTC)),
        (
            "2026-11-22T12:00:00.123456789+00:00",
            datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC),
        ),
        ("2026-11-22T13:00:00+01:00", datetime(2026, 11, 22, 12, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        (None, None),
        ("yesterday", None),
    ],
    ids=["utc", "nanoseconds", "offset", "go-zero", "empty", "absent", "junk"],
)
def test_parse_time(text: str | None, expected: datetime | None) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (999, "999ns"),
        (1_500, "1.5µs"),
        (312_500_000, "312.5ms"),
        (25_000_000, "25ms"),
        (1_234_567_891, "1.234567891s"),
        (2_000_000_000, "2s"),
        (60_000_000_000, "1m0s"),
        (3_600_000_000_000, "1h0m0s"),
        (3_723_500_000_000, "1h2m3.5s"),
        (-1_500_000_000, "-1.5s"),
    ],
    ids=lambda v: str(v),
)
def test_go_duration(ns: int, text: str) -> None:
    assert go_duration(ns) == text


@pytest.mark.parametrize(
    ("size", "vram", "text"),
    [
        (1000, 0, "100% CPU"),
        (1000, 1000, "100% GPU"),
        (1000, 520, "48%/52% CPU/GPU"),
        (1000, 1500, "Unknown"),
    ],
    ids=["cpu", "gpu", "split", "inconsistent"],
)
def test_processor(size: int, vram: int, text: str) -> None:
    assert processor(size, vram) == text


@pytest.mark.parametrize(
    ("expires", "text"),
    [
        (NOW + timedelta(minutes=4, seconds=30), "4 minutes from now"),
        (NOW - timedelta(seconds=1), "Stopping..."),
        (NOW + timedelta(days=365 * 292), "Forever"),
        (None, "Never"),
    ],
    ids=["later", "past", "forever", "never"],
)
def test_until(expires: datetime | None, text: str) -> None:
    assert until(expires, NOW) == text


def test_table_pads_columns_with_four_spaces() -> None:
    table = render_table(
        [
            ["smollm2:latest", "a1b2c3d4e5f6", "98 MB", "2 minutes ago"],
            ["x:1", "ff", "1 KB", "Now"],
        ],
        ["NAME", "ID", "SIZE", "MODIFIED"],
    )
    assert table == (
        "NAME              ID              SIZE     MODIFIED\n"
        "smollm2:latest    a1b2c3d4e5f6    98 MB    2 minutes ago\n"
        "x:1               ff              1 KB     Now\n"
    )


def test_table_wraps_long_cells_at_spaces() -> None:
    table = render_table([["", "one two three four"]], wrap=9)
    assert table == "    one two\n    three\n    four\n"


SHOW_RESPONSE = {
    "license": "Apache License\nVersion 2.0, January 2004\nhttp://www.apache.org/licenses/",
    "system": "You are a helpful assistant.",
    "parameters": 'stop                           "<|im_end|>"\ntemperature                    0.2',
    "details": {"family": "llama", "parameter_size": "134.52M", "quantization_level": "Q4_1"},
    "model_info": {
        "general.architecture": "llama",
        "general.parameter_count": 134515008,
        "llama.context_length": 8192,
        "llama.embedding_length": 576,
    },
    "capabilities": ["completion"],
}


def test_show_info_sections() -> None:
    out = io.StringIO()
    show_info(SHOW_RESPONSE, out)
    assert out.getvalue() == (
        "  Model\n"
        "    architecture        llama\n"
        "    parameters          134.52M\n"
        "    context length      8192\n"
        "    embedding length    576\n"
        "    quantization        Q4_1\n"
        "\n"
        "  Capabilities\n"
        "    completion\n"
        "\n"
        "  Parameters\n"
        '    stop           "<|im_end|>"\n'
        "    temperature    0.2\n"
        "\n"
        "  System\n"
        "    You are a helpful assistant.\n"
        "\n"
        "  License\n"
        "    Apache License\n"
        "    Version 2.0, January 2004\n"
        "    ...\n"
        "\n"
    )


def test_show_info_counts_parameters_when_size_is_absent() -> None:
    response = {**SHOW_RESPONSE, "details": {"quantization_level": "F32"}}
    out = io.StringIO()
    show_info(response, out)
    assert "    parameters          134.52M\n" in out.getvalue()


def test_verbose_summary_matches_ollama() -> None:
    out = io.StringIO()
    summary(
        {
            "total_duration": 1_234_567_891,
            "load_duration": 25_000_000,
            "prompt_eval_count": 10,
            "prompt_eval_duration": 500_000_000,
            "eval_count": 30,
            "eval_duration": 1_500_000_000,
        },
        out,
    )
    assert out.getvalue() == (
        "total duration:       1.234567891s\n"
        "load duration:        25ms\n"
        "prompt eval count:    10 token(s)\n"
        "prompt eval duration: 500ms\n"
        "prompt eval rate:     20.00 tokens/s\n"
        "eval count:           30 token(s)\n"
        "eval duration:        1.5s\n"
        "eval rate:            20.00 tokens/s\n"
    )


def test_the_prompt_rate_counts_only_the_evaluated_tokens() -> None:
    out = io.StringIO()
    final = {"prompt_eval_count": 110, "prompt_eval_duration": 500_000_000,
             "prompt_cached_count": 100}  # fmt: skip
    summary(final, out)
    assert out.getvalue() == (
        "prompt eval count:    110 token(s)\n"
        "prompt eval duration: 500ms\n"
        "prompt eval rate:     20.00 tokens/s\n"
    )


def test_thinking_is_framed_like_ollama() -> None:
    out = io.StringIO()
    writer = ResponseWriter(out, hide_thinking=False)
    writer.write("", "Let me see")
    writer.write("", ".")
    writer.write("Four.", "")
    assert out.getvalue() == "Thinking...\nLet me see.\n...done thinking.\n\nFour."


def test_hidden_thinking_is_kept_but_not_shown() -> None:
    out = io.StringIO()
    writer = ResponseWriter(out, hide_thinking=True)
    writer.write("", "secret")
    writer.write("Four.", "")
    assert out.getvalue() == "Four."
    assert writer.thinking == ["secret"]


# --- progress --------------------------------------------------------------------------

DIGEST = "sha256:" + "6a0746a1ec1a" + "0" * 52
PULL_EVENTS = [
    {"status": "pulling manifest"},
    {"status": f"pulling {DIGEST}", "digest": DIGEST, "total": 98_362_432},
    {"status": f"pulling {DIGEST}", "digest": DIGEST, "total": 98_362_432, "completed": 40_000_000},
    {
        "status": f"pulling {DIGEST}",
        "digest": DIGEST,
        "total": 98_362_432,
        "completed": 98_362_432,
    },
    {"status": "verifying sha256 digest"},
    {"status": "writing manifest"},
    {"status": "success"},
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_pull_progress_in_a_pipe_writes_each_final_line_once() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=FakeClock())
    renderer = StatusRenderer(progress)
    for event in PULL_EVENTS:
        renderer.feed(event)
    progress.stop()
    assert out.getvalue() == (
        "pulling manifest\n"
        "pulling 6a0746a1ec1a: 100% 98 MB\n"
        "verifying sha256 digest\n"
        "writing manifest\n"
        "success\n"
    )


def test_pull_progress_on_a_terminal_redraws_in_place() -> None:
    out = io.StringIO()
    clock = FakeClock()
    progress = Progress(out, tty=True, clock=clock)
    renderer = StatusRenderer(progress)
    renderer.feed(PULL_EVENTS[0])
    renderer.feed(PULL_EVENTS[1])
    clock.now = 2.0
    renderer.feed(PULL_EVENTS[2])
    midway = out.getvalue()
    assert "pulling 6a0746a1ec1a:  40% ▕█████████" in midway
    assert "40 MB/98 MB  20 MB/s  2s" in midway
    for event in PULL_EVENTS[3:]:
        renderer.feed(event)
    progress.stop()
    text = out.getvalue()
    assert text.startswith("\x1b[?25l")  # cursor hidden while drawing
    final = text[text.rindex("\r") + 1 :]
    assert final == (
        "pulling manifest \x1b[K\n"
        f"pulling 6a0746a1ec1a: 100% ▕{'█' * 24}▏ 98 MB\x1b[K\n"
        "verifying sha256 digest \x1b[K\n"
        "writing manifest \x1b[K\n"
        "success \x1b[K\n"
        "\x1b[?25h"
    )


def test_cleared_progress_leaves_nothing_in_a_pipe() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False)
    progress.spinner("")
    progress.stop(clear=True)
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("status", "short"),
    [
        (f"pulling {DIGEST}", "pulling 6a0746a1ec1a"),
        ("pulling 6a0746a1ec1a", "pulling 6a0746a1ec1a"),
        ("pulling manifest", "pulling manifest"),
    ],
)
def test_short_status(status: str, short: str) -> None:
    assert short_status(status) == short


# --- flags -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("5m", "5m"), ("1h30m", "1h30m"), ("0", "0"), ("-1m", -1), (None, None)],
)
def test_keepalive_flag(text: str | None, value: str | int | None) -> None:
    assert _keep_alive(text) == value


def test_keepalive_flag_rejects_bare_numbers() -> None:
    with pytest.raises(CLIError, match="missing unit"):
        _keep_alive("300")


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("false", False), ("high", "high"), ("LOW", "low"), (None, None)],
)
def test_think_flag(text: str | None, value: bool | str | None) -> None:
    assert _think(text) == value


def test_think_flag_rejects_other_levels() -> None:
    with pytest.raises(CLIError, match="must be true, false, high, medium, or low"):
        _think("max")


def test_bare_think_means_true_and_keeps_the_model_positional() -> None:
    assert _normalise(["run", "--think", "m", "hi"]) == ["run", "--think=true", "m", "hi"]


def test_run_without_a_model_asks_for_the_model_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "ollamatrio run: error: the following arguments are required: MODEL"
