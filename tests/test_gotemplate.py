"""Ollama's Go prompt templates: the renderer on real Ollama templates (expected outputs
from Ollama's own ``template/testdata``), its errors, and where the HTTP API applies it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from ollamatrio.engines.simulated import (
    SimulatedBehaviour,
    SimulatedEngine,
    SimulatedEngineFactory,
)
from ollamatrio.template import TemplateError, collate, parse, render_prompt
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec, Message

# -- real templates --------------------------------------------------------------------

# Ollama's template/chatml.gotmpl
CHATML = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""

# The older ChatML layer, with both the .Messages and the legacy branch.
CHATML_BOTH = """{{- if .Messages }}
{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ else -}}
{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ .Response }}<|im_end|>
{{- end -}}"""

# Ollama's template/alpaca.gotmpl: variables, assignment, printf, else-if chain.
ALPACA = """{{- $system := "" }}
{{- range .Messages }}
{{- if eq .Role "system" }}
{{- if not $system }}{{ $system = .Content }}
{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}
{{- end }}
{{- else if eq .Role "user" }}
{{- if $system }}{{ $system }}

{{ $system = "" }}
{{- end }}### Instruction:
{{ .Content }}

{{ else if eq .Role "assistant" }}### Response:
{{ .Content }}

{{ end }}
{{- end }}### Response:
"""

# The llama3.2 library template's shape: $.Tools, range $i, $_, $last via slice/len.
LLAMA3 = """<|start_header_id|>system<|end_header_id|>

{{ if .System }}{{ .System }}
{{- end }}
{{- if .Tools }}You are a helpful assistant with tool calling capabilities.
{{- end }}<|eot_id|>
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>
{{- if and $.Tools $last }}

Given the following functions, respond with a JSON function call.

{{ range $.Tools }}
{{- . }}
{{ end }}
{{ .Content }}<|eot_id|>
{{- else }}

{{ .Content }}<|eot_id|>
{{- end }}{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>
{{- if .ToolCalls }}
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}
{{- end }}
{{- else }}

{{ .Content }}
{{- end }}{{ if not $last }}<|eot_id|>{{ end }}
{{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}
{{- end }}"""

LEGACY = "{{ .System }} {{ .Prompt }}"
MISTRAL_LEGACY = "[INST] {{ .Prompt }}[/INST] {{ .Response }}"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
U2 = {"role": "user", "content": "I'd like to show off how chat templating works!"}
TOOL_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "sunny"},
]

LLAMA3_TOOLS = (
    "<|start_header_id|>system<|end_header_id|>\n\nBe brief.You are a helpful assistant with"
    " tool calling capabilities.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
    "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    '{"name": "get_weather", "parameters": {"city":"Paris"}}<|eot_id|>'
    "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
LLAMA3_LAST_USER_TOOLS = (
    "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant with tool"
    " calling capabilities.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, respond with a JSON function call.\n\n"
    '{"type":"function","function":{"name":"get_weather","description":"Weather in a city",'
    '"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}\n\n'
    "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)

RENDER_CASES = [
    pytest.param(
        CHATML, [U1], None,
        "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n",
        id="chatml-user",
    ),
    pytest.param(
        CHATML, [SYS, U1, A1, U2], None,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
        "<|im_start|>assistant\n",
        id="chatml-system-user-assistant-user",
    ),
    pytest.param(
        CHATML_BOTH, [U1], None,
        "<|im_start|>user\nHello, how are you?<|im_end|>\n<|im_start|>assistant\n",
        id="chatml-both-branches-takes-messages",
    ),
    pytest.param(
        ALPACA, [SYS, U1, A1, U2], None,
        "You are a helpful assistant.\n\n### Instruction:\nHello, how are you?\n\n"
        "### Response:\nI'm doing great. How can I help you today?\n\n"
        "### Instruction:\nI'd like to show off how chat templating works!\n\n### Response:\n",
        id="alpaca-system-user-assistant-user",
    ),
    pytest.param(
        ALPACA, [SYS, {"role": "system", "content": "Second."}, U1], None,
        "You are a helpful assistant.\n\nSecond.\n\n### Instruction:\nHello, how are you?\n\n"
        "### Response:\n",
        id="alpaca-collated-systems",
    ),
    pytest.param(LLAMA3, TOOL_TURN, [WEATHER_TOOL], LLAMA3_TOOLS, id="llama3-tool-call-result"),
    pytest.param(
        LLAMA3, [{"role": "user", "content": "Hi"}], [WEATHER_TOOL], LLAMA3_LAST_USER_TOOLS,
        id="llama3-tools-on-last-user",
    ),
    pytest.param(
        LLAMA3, TOOL_TURN[:2], None,
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        id="llama3-no-tools",
    ),
    pytest.param(LEGACY, [SYS, U1], None, "You are a helpful assistant. Hello, how are you?",
                 id="legacy-single-turn"),
    pytest.param(
        LEGACY, [SYS, U1, A1, U2], None,
        "You are a helpful assistant. Hello, how are you?I'm doing great. How can I help you"
        " today? I'd like to show off how chat templating works!",
        id="legacy-multi-turn-appends-response",
    ),
    pytest.param(
        MISTRAL_LEGACY,
        [U1, A1, U2, {"role": "assistant", "content": "Sure, I"}], None,
        "[INST] Hello, how are you?[/INST] I'm doing great. How can I help you today?"
        "[INST] I'd like to show off how chat templating works![/INST] Sure, I",
        id="legacy-assistant-prefill",
    ),
    pytest.param(
        CHATML_BOTH.replace("{{- if .Messages }}", "{{- if .Nothing }}").replace(
            "range .Messages", "range .Nothing"
        ),
        [SYS, U1, A1, U2], None,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
        "<|im_start|>assistant\n",
        id="legacy-stops-at-response",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("template", "messages", "tools", "expected"), RENDER_CASES)
def test_render_real_templates(
    template: str, messages: list[dict[str, Any]], tools: list[Any] | None, expected: str
) -> None:
    assert render_prompt(template, messages, tools=tools) == expected


def test_suffix_renders_prompt_and_suffix_only() -> None:
    fim = (
        "{{- if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>\n"
        "{{- else }}{{ .Prompt }}\n{{- end }}"
    )
    assert render_prompt(fim, prompt="def add(", suffix="return x") == (
        "<PRE> def add( <SUF>return x <MID>"
    )
    assert render_prompt(fim, [{"role": "user", "content": "hello"}]) == "hello"


@pytest.mark.parametrize(
    ("think", "expected"),
    [(None, "unset"), (False, "off"), (True, "on"), ("high", "on:high")],
    ids=["unset", "false", "true", "level"],
)
def test_think_fields(think: bool | str | None, expected: str) -> None:
    template = (
        "{{ if not .IsThinkSet }}unset{{ else if .Think }}on{{ with .ThinkLevel }}:{{ . }}"
        "{{ end }}{{ else }}off{{ end }}{{ range .Messages }}{{ end }}"
    )
    assert render_prompt(template, [U1], think=think) == expected


def test_collate_joins_consecutive_roles_but_not_tools() -> None:
    system, messages = collate(
        [SYS, U1, {"role": "user", "content": "again"}, *TOOL_TURN[3:], *TOOL_TURN[3:]]
    )
    assert system == "You are a helpful assistant."
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", "You are a helpful assistant."),
        ("user", "Hello, how are you?\n\nagain"),
        ("tool", "sunny"),
        ("tool", "sunny"),
    ]


# -- the language ----------------------------------------------------------------------

DATA = {
    "Name": "ollama",
    "Empty": "",
    "Zero": 0,
    "List": ["a", "b", "c"],
    "Nested": [[1, 2], [3, 4]],
    "Map": {"b": 2, "a": 1},
    "Messages": [{"role": "user", "content": "x"}],
    "Flag": True,
}

LANGUAGE_CASES = [
    ("a  {{- .Name -}}  b", "aollamab", "trim-both"),
    ("a \n\t{{- .Name }} b", "aollama b", "trim-left-newlines"),
    ("{{ .Name -}}\n\n  b", "ollamab", "trim-right"),
    ("x{{/* a comment */}}y", "xy", "comment"),
    ("x {{- /* trimmed */ -}} y", "xy", "comment-trimmed"),
    ("{{ if .Empty }}1{{ else if .Zero }}2{{ else if .List }}3{{ else }}4{{ end }}", "3", "elif"),
    ("{{ if .Empty }}1{{ else if .Zero }}2{{ else }}4{{ end }}", "4", "elif-else"),
    ("{{ if and .Flag .Name }}{{ .Name }}{{ end }}", "ollama", "and"),
    ("{{ or .Empty .Zero .Name }}", "ollama", "or-first-truthy"),
    ("{{ and .Flag .Zero .Name }}", "0", "and-first-falsy"),
    ("{{ and .Empty (index .List 9) }}|{{ or .Flag (index .List 9) }}", "|true", "short-circuit"),
    ("{{ not .Empty }} {{ not .List }}", "true false", "not"),
    ("{{ len .List }} {{ len .Name }} {{ len .Map }} {{ len \"é\" }}", "3 6 2 2", "len"),
    ("{{ slice .List 1 }} {{ slice .List 0 2 }} {{ slice .Name 1 3 }}", "[b c] [a b] ll", "slice"),
    ("{{ index .List 2 }} {{ index .Nested 1 0 }} {{ index .Map \"a\" }}", "c 3 1", "index"),
    ("{{ range $i, $v := .List }}{{ $i }}={{ $v }};{{ end }}", "0=a;1=b;2=c;", "range-vars"),
    ("{{ range .List }}{{ . }}{{ end }}", "abc", "range-dot"),
    ("{{ range $k, $v := .Map }}{{ $k }}{{ $v }}{{ end }}", "a1b2", "range-map-sorted"),
    ("{{ range .Missing }}x{{ else }}none{{ end }}", "none", "range-else"),
    ("{{ range .List }}{{ if eq . \"b\" }}{{ continue }}{{ end }}{{ . }}{{ end }}", "ac",
     "continue"),
    ("{{ range .List }}{{ if eq . \"b\" }}{{ break }}{{ end }}{{ . }}{{ end }}", "a", "break"),
    ("{{ range .List }}{{ $.Name }}{{ end }}", "ollamaollamaollama", "root-in-range"),
    ("{{ with .Name }}<{{ . }}>{{ end }}{{ with .Empty }}x{{ else }}y{{ end }}", "<ollama>y",
     "with"),
    ("{{ $x := 1 }}{{ if .Flag }}{{ $x = 2 }}{{ $y := 3 }}{{ end }}{{ $x }}", "2", "assign-scope"),
    ("{{ $m := index .Messages 0 }}{{ $m.role }}:{{ $m.Content }}", "user:x", "var-fields"),
    ("{{ (index .Messages 0).Content }}", "x", "chain"),
    ("{{ .Name | len }} {{ \"a\" | printf \"%s-%s\" \"b\" }}", "6 b-a", "pipeline"),
    ("{{ print 1 2 \"x\" 3 }}|{{ println \"a\" 1 }}", "1 2x3|a 1\n", "print"),
    ("{{ printf \"%d %5.2f %q %v %t %x %%\" 3 1.5 \"q\" .List true 255 }}",
     "3  1.50 \"q\" [a b c] true ff %", "printf"),
    ("{{ printf \"%s %s\" \"one\" }}", "one %!s(MISSING)", "printf-missing"),
    ("{{ json .Map }} {{ json .List }} {{ json \"<a&b>\" }}",
     '{"b":2,"a":1} ["a","b","c"] "\\u003ca\\u0026b\\u003e"', "json"),
    ("{{ .Map }}", '{"b":2,"a":1}', "mapping-prints-json"),
    ("{{ eq .Name \"x\" \"ollama\" }} {{ ne 1 2 }} {{ lt 1 2 }} {{ ge \"b\" \"a\" }}",
     "true true true true", "compare"),
    ("{{ .Missing }}|{{ .Missing.Deeper }}|{{ if .Missing }}x{{ end }}", "||", "missing-is-zero"),
    ("{{ -1 }} {{ 0x10 }} {{ 2.5 }} {{ 'a' }} {{ `raw\\n` }} {{ \"esc\\t\" }} {{ nil }}",
     "-1 16 2.5 97 raw\\n esc\t ", "literals"),
    ("{{ 1e6 }} {{ 1e-7 }} {{ 123456.0 }} {{ 3.0 }} {{ print 1234567.0 2.5 }}",
     "1e+06 1e-07 123456 3 1.234567e+06 2.5", "floats-print-as-go"),
    ("{{ printf \"%v %g %q\" 1234567.0 1e-5 \"a\\x01\\u2028\" }}",
     "1.234567e+06 1e-05 \"a\\x01\\u2028\"", "printf-floats-and-quote"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "expected"),
    [pytest.param(t, e, id=i) for t, e, i in LANGUAGE_CASES],
)
def test_language(template: str, expected: str) -> None:
    assert parse(template).execute(DATA) == expected


def test_parse_is_cached_per_text() -> None:
    assert parse("{{ .A }}x") is parse("{{ .A }}x")


ERROR_CASES = [
    ("{{ foo .X }}", 'line 1, column 4: function "foo" not defined', "unknown-function"),
    ("a\n  {{ end }}", "line 2, column 3: unexpected {{end}}", "stray-end"),
    ("x\n{{ if .X }}y", "line 2, column 1: unexpected EOF: {{if}} has no {{end}}", "missing-end"),
    ("{{ else }}", "line 1, column 1: unexpected {{else}}", "stray-else"),
    ("{{ range .L }}{{ else }}{{ else }}{{ end }}",
     "line 1, column 25: expected {{end}} for {{range}}", "double-else"),
    ("{{ .X", "line 1, column 6: unclosed action", "unclosed-action"),
    ('{{ "abc }}', "line 1, column 4: unterminated quoted string", "unterminated-string"),
    ("{{ if }}{{ end }}", "line 1, column 1: missing value for if", "if-without-pipeline"),
    ("{{ (.X }}", "line 1, column 4: unclosed left paren", "unclosed-paren"),
    ("{{ .X ) }}", "line 1, column 7: unexpected right paren", "stray-paren"),
    ("{{ .X | }}", "line 1, column 7: missing value for command", "empty-pipeline-stage"),
    ("{{ break }}", "line 1, column 1: {{break}} outside {{range}}", "break-outside-range"),
    ("{{ template \"x\" }}", "line 1, column 1: {{template}} is not supported", "template"),
    ("{{/* open", "line 1, column 1: unclosed comment", "unclosed-comment"),
    ("{{ .X ^ }}", "line 1, column 7: unexpected '^' in action", "bad-character"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "message"), [pytest.param(t, m, id=i) for t, m, i in ERROR_CASES]
)
def test_parse_errors_name_the_position(template: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse(template)
    assert str(info.value) == f"template: {message}"


EXEC_ERROR_CASES = [
    ("{{ index .L 3 }}", "line 1, column 4: error calling index: index out of range: 3"),
    ("x\n {{ slice .L 2 1 }}", "line 2, column 5: error calling slice: invalid slice index"),
    ("{{ len 3 }}", "line 1, column 4: error calling len: len of type int"),
    ('{{ eq 1 "a" }}', "line 1, column 4: error calling eq: incompatible types"),
    ("{{ $nope }}", "line 1, column 4: undefined variable: $nope"),
    ("{{ .L.Field }}", "line 1, column 4: can't evaluate field Field in type list"),
    ("{{ .L 1 }}", "line 1, column 4: can't give argument to non-function"),
    ("{{ not 1 2 }}", "line 1, column 4: wrong number of args for not: got 2"),
    ('{{ range "ab" }}{{ end }}', "line 1, column 1: range can't iterate over ab"),
]


@pytest.mark.parametrize(("template", "message"), EXEC_ERROR_CASES)
def test_execution_errors_name_the_position(template: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse(template).execute({"L": [1, 2]})
    assert str(info.value).startswith(f"template: {message}")


# -- the HTTP API ----------------------------------------------------------------------

FAST = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000)


class _RecordingEngine:
    def __init__(self, inner: SimulatedEngine, seen: list[CompletionRequest]) -> None:
        self._inner = inner
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[AsyncIterator[Chunk]]:
        self._seen.append(request)
        async with self._inner.complete(request) as chunks:
            yield chunks


class RecordingEngines:
    """Simulated engines that keep every :class:`CompletionRequest` they are sent."""

    def __init__(self) -> None:
        self.inner = SimulatedEngineFactory(None, default=FAST)
        self.requests: list[CompletionRequest] = []

    @asynccontextmanager
    async def open(self, spec: LoadSpec, **_: Any) -> AsyncIterator[_RecordingEngine]:
        async with self.inner.open(spec) as engine:
            yield _RecordingEngine(engine, self.requests)

    async def keep_spare(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.keep_spare(task_status=task_status)


async def _create(c: httpx.AsyncClient, **body: Any) -> None:
    r = await c.post("/api/create", json={**body, "stream": False})
    assert r.status_code == 200, r.text


async def test_go_template_applies_where_the_gguf_has_no_chat_template(
    api_server, tiny_gguf
) -> None:
    engines = RecordingEngines()
    extra = {"bare": tiny_gguf(chat_template=None, name="bare")}
    hi = [{"role": "user", "content": "hi"}]
    with trio.fail_after(30):
        async with (
            api_server(engines=engines, models=extra) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            await _create(c, model="go", **{"from": "bare"}, template=CHATML, system="Be brief.")
            expected = (
                "<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
            )
            r = await c.post("/api/chat", json={"model": "go", "messages": hi, "stream": False})
            assert r.status_code == 200, r.text
            assert r.json()["message"]["content"]
            chat = engines.requests[-1]
            assert (chat.prompt, chat.messages) == (expected, None)

            r = await c.post("/api/generate", json={"model": "go", "prompt": "hi", "stream": False})
            assert r.status_code == 200, r.text
            assert (engines.requests[-1].prompt, engines.requests[-1].messages) == (expected, None)

            # The OpenAI routes build the engine request the same way.
            r = await c.post("/v1/chat/completions", json={"model": "go", "messages": hi})
            assert r.status_code == 200, r.text
            assert engines.requests[-1].prompt == expected

            # Tool calling stays on llama.cpp's messages path.
            tools_template = (
                "{{ if .Tools }}<tools>{{ range .Tools }}{{ . }}{{ end }}</tools>{{ end }}"
            )
            await _create(c, model="go-tools", **{"from": "bare"}, template=tools_template + CHATML)
            r = await c.post("/api/chat", json={
                "model": "go-tools", "messages": hi, "tools": [WEATHER_TOOL], "stream": False,
            })  # fmt: skip
            assert r.status_code == 200, r.text
            tools = engines.requests[-1]
            assert tools.prompt is None
            assert list(tools.messages or ()) == [Message("user", "hi")]
            assert list(tools.tools or ()) == [WEATHER_TOOL]


async def test_generate_applies_the_request_template(api_server) -> None:
    engines = RecordingEngines()
    with trio.fail_after(30):
        async with api_server(engines=engines) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            body = {
                "model": "tiny",
                "prompt": "P",
                "system": "S",
                "template": "<{{ .System }}|{{ .Prompt }}>",
                "stream": False,
            }
            r = await c.post("/api/generate", json=body)
            assert r.status_code == 200, r.text
            assert (engines.requests[-1].prompt, engines.requests[-1].messages) == ("<S|P>", None)

            r = await c.post("/api/generate", json={**body, "template": "x\n{{ if .P }}"})
            assert r.status_code == 400
            assert r.json()["error"] == (
                "template: line 2, column 1: unexpected EOF: {{if}} has no {{end}}"
            )


async def test_a_gguf_chat_template_keeps_the_messages_path(api_server) -> None:
    engines = RecordingEngines()
    hi = [{"role": "user", "content": "hi"}]
    with trio.fail_after(30):
        async with api_server(engines=engines) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            # "tiny" has a Jinja chat template in its GGUF: it wins over a Go layer.
            await _create(c, model="go-on-jinja", **{"from": "tiny"}, template=CHATML)
            for name in ("tiny", "go-on-jinja"):
                r = await c.post("/api/chat", json={"model": name, "messages": hi, "stream": False})
                assert r.status_code == 200, r.text
                assert engines.requests[-1].prompt is None
                assert list(engines.requests[-1].messages or ()) == [Message("user", "hi")]
