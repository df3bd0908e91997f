"""Modelfile parsing, create planning and show rendering, checked against Ollama's parser
tests (parser/parser_test.go) and the JSON the official ollama client sends."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ollama._types import CreateRequest

from ollamatrio.errors import InvalidRequestError
from ollamatrio.modelfile import (
    BlobUpload,
    Message,
    Modelfile,
    ModelfileError,
    decode_modelfile,
    file_digest,
    format_modelfile,
    parse_modelfile,
    parse_parameter_value,
    render_modelfile,
    render_parameters,
)

TEMPLATE = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>"
    "{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>"
)


def mf(*models: str, **fields: object) -> Modelfile:
    return Modelfile(models=models or ("foo",), **fields)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# Parsing: valid input

VALID = [
    ("minimal", "FROM foo", mf()),
    ("no-trailing-newline-multibyte", "FROM test\n\tSYSTEM 你好👋", mf("test", system="你好👋")),
    ("case-insensitive", "from foo\nSyStEm hi\nparameter top_k 3", mf(system="hi",
        parameters={"top_k": 3})),
    ("comments-blank-lines-indent", "\n# comment\n\n   FROM foo\n\t# indented comment\n\n", mf()),
    ("hash-inside-value-is-text", "FROM foo # not a comment", mf("foo # not a comment")),
    ("spaces-inside-unquoted", "FROM     FOOO BAR    ", mf("FOOO BAR")),
    ("quoted-keeps-spaces", 'FROM "     model 1"\nLICENSE "MIT       "',
        mf("     model 1", licenses=("MIT       ",))),
    ("param-extra-spaces", "FROM foo\nPARAMETER  temperature     0.5  ",
        mf(parameters={"temperature": 0.5})),
    ("from-after-parameter", "PARAMETER seed 1\nFROM foo", mf(parameters={"seed": 1})),
    ("triple-quoted-multiline", 'FROM foo\nSYSTEM """\nThis is a\nmultiline system.\n"""\n',
        mf(system="\nThis is a\nmultiline system.\n")),
    ("triple-quoted-close-on-text-line", 'FROM foo\nSYSTEM """This is a\nmultiline."""',
        mf(system="This is a\nmultiline.")),
    ("triple-quoted-with-quotes", 'FROM foo\nSYSTEM """\nSay "Hello!".\n"""',
        mf(system='\nSay "Hello!".\n')),
    ("triple-quoted-trailing-blanks", f'FROM foo\nTEMPLATE """   {TEMPLATE}   """    \n',
        mf(template=f"   {TEMPLATE}   ")),
    ("double-quoted-multiline", 'FROM foo\nSYSTEM "line one\nline two"',
        mf(system="line one\nline two")),
    ("no-escapes-inside-quotes", 'FROM foo\nSYSTEM "a \\" b"', mf(system='a \\" b')),
    ("empty-triple", 'FROM foo\nSYSTEM """"""', mf(system="")),
    ("empty-double", 'FROM foo\nSYSTEM ""', mf(system="")),
    ("single-quote-inside", "FROM foo\nSYSTEM \"'\"", mf(system="'")),
    ("quote-soup", 'FROM foo\nSYSTEM """\'\'"\'""\'"""', mf(system="''\"'\"\"'")),
    ("last-template-wins", "FROM foo\nTEMPLATE a\nTEMPLATE b", mf(template="b")),
    ("licenses-repeat", "FROM foo\nLICENSE one\nLICENSE two", mf(licenses=("one", "two"))),
    ("stop-accumulates", 'FROM foo\nPARAMETER stop <|eot_id|>\nPARAMETER stop "### User: "\n'
        'PARAMETER stop """### User:\n"""', mf(parameters={"stop": ["<|eot_id|>", "### User: ",
        "### User:\n"]})),
    ("typed-parameters",
        "FROM foo\nPARAMETER num_ctx 8192\nPARAMETER temperature 1.0\nPARAMETER use_mmap F\n"
        "PARAMETER seed -1\nPARAMETER top_p .9\nPARAMETER num_gpu +2\nPARAMETER min_p 5e-2",
        mf(parameters={"num_ctx": 8192, "temperature": 1.0, "use_mmap": False, "seed": -1,
            "top_p": 0.9, "num_gpu": 2, "min_p": 0.05})),
    ("float32-rounding", "FROM foo\nPARAMETER temperature 0.1234567891",
        mf(parameters={"temperature": 0.12345679})),
    ("last-scalar-parameter-wins", "FROM foo\nPARAMETER top_k 1\nPARAMETER top_k 2",
        mf(parameters={"top_k": 2})),
    ("messages", "FROM foo\nMESSAGE system You parse.\nMESSAGE user Hey there!\n"
        'MESSAGE assistant """\nHello!\n"""\nMESSAGE tool {"ok": true}',
        mf(messages=(Message("system", "You parse."), Message("user", "Hey there!"),
            Message("assistant", "\nHello!\n"), Message("tool", '{"ok": true}')))),
    ("adapter-draft-renderer-parser", "FROM foo\nADAPTER ./lora.gguf\nDRAFT ./draft\n"
        "RENDERER qwen3\nPARSER qwen3", mf(adapters=("./lora.gguf",), drafts=("./draft",),
        renderer="qwen3", parser="qwen3")),
    ("requires-normalised", "FROM foo\nREQUIRES v0.14.0", mf(requires="0.14.0")),
    ("requires-short-semver", "FROM foo\nREQUIRES 1.2", mf(requires="1.2")),
    ("several-from", "FROM /blobs/model\nFROM /blobs/projector",
        mf("/blobs/model", "/blobs/projector")),
    ("crlf", "FROM foo\r\nSYSTEM \"\"\"a\r\nb\"\"\"\r\n", mf(system="a\r\nb")),
    ("bom", "\ufeffFROM foo", mf()),
    ("control-chars-dropped", "FROM foo\nSYSTEM a\x00b\x1bc\td", mf(system="abc\td")),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_parse_valid(text: str, expected: Modelfile) -> None:
    assert parse_modelfile(text) == expected


def test_deprecated_parameter_is_dropped_with_a_warning() -> None:
    parsed = parse_modelfile("FROM foo\nPARAMETER mirostat 2\nPARAMETER seed 3")
    assert parsed.parameters == {"seed": 3}
    assert parsed.warnings == ("line 2: parameter mirostat is deprecated and ignored",)


def test_decode_modelfile_handles_boms() -> None:
    text = "FROM bob\nSYSTEM 你好👋\n"
    for data in (
        text.encode(),
        b"\xef\xbb\xbf" + text.encode(),
        b"\xff\xfe" + text.encode("utf-16-le"),
        b"\xfe\xff" + text.encode("utf-16-be"),
    ):
        assert decode_modelfile(data) == text
        assert parse_modelfile(decode_modelfile(data)) == mf("bob", system="你好👋")


# ----------------------------------------------------------------------------------------
# Parsing: errors, each with its line

ERRORS = [
    ("unknown-instruction", "FROM foo\n\nFORM bar", 3, 'unknown instruction "FORM"'),
    ("instruction-without-value", "FROM foo\nSYSTEM\n", 2, "SYSTEM needs a value"),
    ("from-without-value", "# c\nFROM", 2, "FROM needs a value"),
    ("from-empty", 'FROM ""', 1, "FROM needs a model name or a path"),
    ("missing-from", "# only a comment\nSYSTEM hi\n", None, "no FROM line"),
    ("empty-file", "", None, "no FROM line"),
    ("unterminated-triple", 'FROM foo\nSYSTEM """\nno end\n', 2, 'unterminated """ quote'),
    ("unclosed-triple-two-quotes", 'FROM foo\nSYSTEM """This is a system.""', 2,
        'unterminated """ quote'),
    ("unterminated-double", 'FROM foo\nTEMPLATE "abc\n\nMESSAGE user x', 2, 'unterminated " quote'),
    ("text-after-closing-quote", 'FROM foo\nSYSTEM "a" b\n', 2, 'unterminated " quote'),
    ("parameter-without-value", "FROM foo\nPARAMETER temperature\n", 2,
        "PARAMETER needs a name and a value"),
    ("parameter-without-name", "FROM foo\n\nPARAMETER \n", 3, "PARAMETER needs a name and a value"),
    ("unknown-parameter", "FROM foo\nPARAMETER param1 value1", 2, "unknown parameter 'param1'"),
    ("parameter-name-is-case-sensitive", "FROM foo\nPARAMETER Temperature 1", 2,
        "unknown parameter 'Temperature'"),
    ("bad-int", "FROM foo\nPARAMETER num_ctx 4k", 2,
        "invalid int value '4k' for parameter num_ctx"),
    ("int-not-float", "FROM foo\nPARAMETER top_k 1.0", 2, "invalid int value '1.0'"),
    ("int-out-of-range", "FROM foo\nPARAMETER seed 9223372036854775808", 2, "invalid int value"),
    ("bad-float", "FROM foo\nPARAMETER temperature hot", 2, "invalid float value 'hot'"),
    ("float-nan", "FROM foo\nPARAMETER temperature nan", 2, "invalid float value 'nan'"),
    ("float-overflow", "FROM foo\nPARAMETER temperature 1e39", 2, "invalid float value '1e39'"),
    ("bad-bool", "FROM foo\nPARAMETER use_mmap yes", 2, "invalid bool value 'yes'"),
    ("bad-role", "FROM foo\nMESSAGE badguy I'm a bad guy!", 2, 'not "badguy"'),
    ("role-is-case-sensitive", "FROM foo\nMESSAGE User hi", 2, 'not "User"'),
    ("message-without-content", "FROM foo\nMESSAGE system\n", 2,
        "MESSAGE needs a role and a message"),
    ("bad-requires", "FROM foo\nREQUIRES latest", 2, "REQUIRES must be a valid semver"),
    ("requires-leading-zero", "FROM foo\nREQUIRES 0.01.0", 2, "REQUIRES must be a valid semver"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "line", "message"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_parse_errors(text: str, line: int | None, message: str) -> None:
    with pytest.raises(ModelfileError) as info:
        parse_modelfile(text)
    assert isinstance(info.value, InvalidRequestError)  # served as a 400
    assert info.value.line == line
    assert message in info.value.message
    prefix = f"line {line}: " if line is not None else ""
    assert str(info.value) == prefix + info.value.message


def test_parse_parameter_value_is_usable_on_its_own() -> None:
    assert parse_parameter_value("num_ctx", "2048") == 2048
    assert parse_parameter_value("stop", "</s>") == "</s>"
    with pytest.raises(ModelfileError, match="unknown parameter 'numa'") as info:
        parse_parameter_value("numa", "true")
    assert info.value.line is None


# ----------------------------------------------------------------------------------------
# Rendering


def test_render_modelfile_matches_ollama_show_layout() -> None:
    model = Modelfile(
        models=("/m/blobs/sha256-aaa", "/m/blobs/sha256-proj"),
        adapters=("/m/blobs/sha256-lora",),
        template='{{ .System }} "quoted"\n{{ .Prompt }}',
        system="You are terse.",
        parameters={"stop": ["<|im_start|>", "<|im_end|>"], "temperature": 1.0, "num_ctx": 4096},
        licenses=("MIT",),
        messages=(Message("user", "Hi"), Message("assistant", "  padded  ")),
    )
    assert render_modelfile(model, "qwen:0.5b") == (
        '# Modelfile generated by "ollama show"\n'
        "# To build a new Modelfile based on this, replace FROM with:\n"
        "# FROM qwen:0.5b\n"
        "\n"
        "FROM /m/blobs/sha256-aaa\n"
        "ADAPTER /m/blobs/sha256-lora\n"
        "FROM /m/blobs/sha256-proj\n"
        'TEMPLATE """{{ .System }} "quoted"\n{{ .Prompt }}"""\n'
        "SYSTEM You are terse.\n"
        "PARAMETER num_ctx 4096\n"
        "PARAMETER stop <|im_start|>\n"
        "PARAMETER stop <|im_end|>\n"
        "PARAMETER temperature 1\n"
        "LICENSE MIT\n"
        "MESSAGE user Hi\n"
        'MESSAGE assistant "  padded  "\n'
    )


def test_render_parameters_is_ollamas_aligned_go_syntax() -> None:
    params = {
        "top_p": 0.95,
        "stop": ["<|im_end|>", 'say "hi"\n'],
        "temperature": 1,
        "min_p": 1e-05,
        "num_ctx": 1048576,
        "presence_penalty": 1234567.0,
        "use_mmap": False,
        "repeat_penalty": 1.1000000238418579,  # a float32 stored as float64 by Go
    }
    assert render_parameters(params) == "\n".join(
        [
            "min_p                          1e-05",
            "num_ctx                        1048576",
            "presence_penalty               1.234567e+06",
            "repeat_penalty                 1.100000023841858",
            'stop                           "<|im_end|>"',
            'stop                           "say \\"hi\\"\\n"',
            "temperature                    1",
            "top_p                          0.95",
            "use_mmap                       false",
        ]
    )
    assert render_parameters({}) == ""


ROUND_TRIP = [
    mf(),
    mf("/blobs/sha256-x", "/blobs/sha256-proj", adapters=("/a b/lora.gguf",), drafts=("/d",)),
    mf(template=TEMPLATE, system="line\n  indented\n", renderer="r", parser="p", requires="0.14.0"),
    mf(system='"starts with a quote"', licenses=("MIT", 'Apache "2.0"\n...', "")),
    mf(system="\tedge tabs\t", messages=(Message("user", ""), Message("tool", "a\r\nb"))),
    mf(parameters={"stop": ["<|eot_id|>", " spaced ", '"q"', ""], "temperature": 0.7,
        "num_ctx": 131072, "seed": -1, "use_mmap": True, "min_p": 1e-05, "top_p": 1.0}),
]  # fmt: skip


@pytest.mark.parametrize("model", ROUND_TRIP, ids=range(len(ROUND_TRIP)))
def test_parse_render_round_trip(model: Modelfile) -> None:
    assert parse_modelfile(render_modelfile(model, "name:tag")) == model
    assert parse_modelfile(format_modelfile(model)) == model


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_every_valid_case_survives_formatting(text: str, expected: Modelfile) -> None:
    assert parse_modelfile(format_modelfile(parse_modelfile(text))) == expected


# ----------------------------------------------------------------------------------------
# Digests and /api/create plans


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("data", "digest"),
    [
        (b"", "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        (b"hello\n", "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"),
        (bytes(range(256)) * 9000, sha256(bytes(range(256)) * 9000)),  # > 2 read chunks
    ],
    ids=["empty", "hello", "multi-chunk"],
)
def test_file_digest(tmp_path: Path, data: bytes, digest: str) -> None:
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_digest(path) == digest
    assert file_digest(str(path)) == digest


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Modelfile directory distinct from the working directory."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    base = tmp_path / "project"
    base.mkdir()
    return base


def official_client_body(body: dict[str, object]) -> dict[str, object]:
    """The body ollama-python's create() sends for the same fields."""
    fields = {"from_" if k == "from" else k: v for k, v in body.items()}
    return CreateRequest(**fields).model_dump(exclude_none=True)  # type: ignore[arg-type]


def test_plan_for_a_model_name(elsewhere: Path) -> None:
    text = (
        "FROM llama3.2\nPARAMETER temperature 0.5\nPARAMETER top_k 1\nPARAMETER stop a\n"
        "PARAMETER stop b\nSYSTEM You are a bot.\nTEMPLATE {{ .Prompt }}\nLICENSE l1\n"
        "LICENSE l2\nMESSAGE user Hello there!\nMESSAGE assistant Hi!\nREQUIRES 0.12.0\n"
    )
    plan = parse_modelfile(text).to_create_request(elsewhere)
    assert plan.uploads == ()
    assert plan.request == {
        "from": "llama3.2",
        "template": "{{ .Prompt }}",
        "system": "You are a bot.",
        "license": ["l1", "l2"],
        "parameters": {"temperature": 0.5, "top_k": 1, "stop": ["a", "b"]},
        "messages": [
            {"role": "user", "content": "Hello there!"},
            {"role": "assistant", "content": "Hi!"},
        ],
        "requires": "0.12.0",
    }
    body = plan.body("mine", quantize="q4_K_M", stream=False)
    assert (body["model"], body["quantize"], body["stream"]) == ("mine", "q4_K_M", False)
    without_requires = {k: v for k, v in body.items() if k != "requires"}
    assert official_client_body(without_requires) == without_requires


def test_plan_for_a_relative_gguf_path(elsewhere: Path) -> None:
    weights = elsewhere / "weights" / "tiny.gguf"
    weights.parent.mkdir()
    weights.write_bytes(b"GGUF fake weights")
    (elsewhere / "lora.gguf").write_bytes(b"GGUF adapter")
    # the same name relative to the working directory must not be picked up
    (Path.cwd() / "weights").mkdir()
    (Path.cwd() / "weights" / "tiny.gguf").write_bytes(b"wrong file")

    text = "FROM ./weights/tiny.gguf\nADAPTER lora.gguf\nSYSTEM s\n"
    plan = parse_modelfile(text).to_create_request(elsewhere)

    assert plan.request == {
        "files": {"tiny.gguf": sha256(b"GGUF fake weights")},
        "adapters": {"lora.gguf": sha256(b"GGUF adapter")},
        "system": "s",
    }
    assert plan.uploads == (
        BlobUpload(weights, sha256(b"GGUF fake weights"), 17),
        BlobUpload(elsewhere / "lora.gguf", sha256(b"GGUF adapter"), 12),
    )
    body = plan.body("mine")
    assert official_client_body(body) == body


def test_plan_expands_home_and_accepts_absolute_paths(
    elsewhere: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "m.gguf").write_bytes(b"home")
    absolute = tmp_path / "abs.gguf"
    absolute.write_bytes(b"abs")
    plan = parse_modelfile(f"FROM ~/m.gguf\nFROM {absolute}").to_create_request(elsewhere)
    assert plan.request == {"files": {"m.gguf": sha256(b"home"), "abs.gguf": sha256(b"abs")}}
    assert [u.path for u in plan.uploads] == [home / "m.gguf", absolute]


def test_plan_for_a_directory_and_a_glob(elsewhere: Path) -> None:
    shards = elsewhere / "shards"
    shards.mkdir()
    for i in (2, 1):
        (shards / f"model-0000{i}-of-00002.gguf").write_bytes(b"part %d" % i)
    (shards / "README.md").write_text("not a model")

    expected = {
        "model-00001-of-00002.gguf": sha256(b"part 1"),
        "model-00002-of-00002.gguf": sha256(b"part 2"),
    }
    by_dir = parse_modelfile("FROM shards").to_create_request(elsewhere)
    by_glob = parse_modelfile("FROM ./shards/model-*.gguf").to_create_request(elsewhere)
    assert by_dir.request == by_glob.request == {"files": expected}
    assert [u.path.name for u in by_dir.uploads] == sorted(expected)


def test_plan_for_a_hugging_face_folder(elsewhere: Path) -> None:
    """A safetensors checkpoint sends its shards, its JSON files and its chat template,
    as Ollama's CLI gathers them; a stray GGUF or README beside them stays home."""
    folder = elsewhere / "my-finetune"
    folder.mkdir()
    names = [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    ]  # fmt: skip
    for name in [*names, "README.md", "other.gguf"]:
        (folder / name).write_text(name)
    plan = parse_modelfile("FROM ./my-finetune").to_create_request(elsewhere)
    assert plan.request == {"files": {name: sha256(name.encode()) for name in names}}
    assert [u.path.name for u in plan.uploads] == [*names[:2], *sorted(names[2:])]


def test_plan_glob_without_match_is_a_model_name(elsewhere: Path) -> None:
    plan = parse_modelfile("FROM model-*.gguf").to_create_request(elsewhere)
    assert plan.request == {"from": "model-*.gguf"}


def test_plan_name_plus_projector_file(elsewhere: Path) -> None:
    (elsewhere / "mmproj.gguf").write_bytes(b"proj")
    plan = parse_modelfile("FROM llava\nFROM mmproj.gguf").to_create_request(elsewhere)
    assert plan.request == {"from": "llava", "files": {"mmproj.gguf": sha256(b"proj")}}


def test_plan_reuses_one_upload_for_the_same_file(elsewhere: Path) -> None:
    (elsewhere / "m.gguf").write_bytes(b"m")
    plan = parse_modelfile("FROM m.gguf\nFROM ./m.gguf").to_create_request(elsewhere)
    assert len(plan.uploads) == 1
    assert plan.request == {"files": {"m.gguf": sha256(b"m")}}


def test_plan_sends_a_draft_that_is_no_file_as_a_model_name(elsewhere: Path) -> None:
    (elsewhere / "d.gguf").write_bytes(b"d")
    plan = parse_modelfile("FROM x\nDRAFT smol:135m").to_create_request(elsewhere)
    assert plan.request == {"from": "x", "draft": "smol:135m"}
    plan = parse_modelfile("FROM x\nDRAFT ./d.gguf").to_create_request(elsewhere)
    assert plan.request == {"from": "x", "draft_files": {"d.gguf": sha256(b"d")}}


def test_plan_omits_empty_template_and_system(elsewhere: Path) -> None:
    plan = parse_modelfile('FROM x\nSYSTEM ""\nTEMPLATE ""').to_create_request(elsewhere)
    assert plan.request == {"from": "x"}


PLAN_ERRORS = [
    ("missing-adapter", "FROM x\nADAPTER ./nope.gguf", "ADAPTER ./nope.gguf: no such file"),
    ("missing-draft", "FROM x\nDRAFT ./nope", "DRAFT ./nope: no such file"),
    ("missing-draft-gguf", "FROM x\nDRAFT nope.gguf", "DRAFT nope.gguf: no such file"),
    ("draft-same-as-from", "FROM a/m.gguf\nDRAFT ./a/m.gguf", "DRAFT must not reference"),
    ("empty-directory", "FROM empty", "no GGUF or safetensors files found in directory"),
    ("basename-collision", "FROM a/m.gguf\nFROM b/m.gguf",
        'two different files are named "m.gguf"'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in PLAN_ERRORS], ids=[c[0] for c in PLAN_ERRORS]
)
def test_plan_errors(elsewhere: Path, text: str, message: str) -> None:
    for sub, data in (("a", b"a"), ("b", b"b")):
        os.makedirs(elsewhere / sub)
        (elsewhere / sub / "m.gguf").write_bytes(data)
    (elsewhere / "empty").mkdir()
    with pytest.raises(ModelfileError, match=message.replace(".", r"\.")):
        parse_modelfile(text).to_create_request(elsewhere)
