"""The per-model config file (``OLLAMATRIO_CONFIG``): parsing, name normalisation, and one
clear line for every way the file can be wrong."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ollamatrio.config import Settings
from ollamatrio.devices import GpuInfo
from ollamatrio.kv_cache import KvCacheTypes, requested_kv_types
from ollamatrio.model_config import (
    DEFAULT,
    ConfigError,
    ModelConfig,
    ModelSettings,
    load_model_config,
    parse_model_config,
)

PATH = Path("/etc/ollamatrio.toml")

EXAMPLE = """
[models."llama3.2:3b"]
num_parallel = 2
num_ctx = 8192
keep_alive = "1h"
preload = true
gpus = [0, "GPU-5d1e"]

[models.nomic-embed-text]
pinned = true
preload = true
prompt_cache = 0

[models."qwen2.5:0.5b"]
keep_alive = -1
gpus = "cpu"

[models."hf.co/org/repo:Q4_K_M"]
keep_alive = 90
gpus = []
"""


def parse(text: str) -> ModelConfig:
    return parse_model_config(text, PATH)


def gpu(index: int, uuid: str) -> GpuInfo:
    return GpuInfo(
        id=uuid, index=index, library="CUDA", name="sim", total=1, free=1,
        integrated=False, compute=(9, 0), driver=(12, 4),
    )  # fmt: skip


def test_the_example_parses() -> None:
    config = parse(EXAMPLE)
    assert config.path == PATH
    assert config.models == {
        "llama3.2:3b": ModelSettings(
            num_parallel=2, num_ctx=8192, keep_alive=3600.0, preload=True, gpus=(0, "GPU-5d1e")
        ),
        "nomic-embed-text": ModelSettings(pinned=True, preload=True, prompt_cache=0),
        "qwen2.5:0.5b": ModelSettings(keep_alive=math.inf, gpus=()),
        "hf.co/org/repo:Q4_K_M": ModelSettings(keep_alive=90.0, gpus=()),
    }
    assert config.preloads == ["llama3.2:3b", "nomic-embed-text"]


@pytest.mark.parametrize(
    ("asked", "configured"),
    [
        ("nomic-embed-text:latest", "nomic-embed-text"),
        ("NOMIC-Embed-Text", "nomic-embed-text"),
        ("library/nomic-embed-text", "nomic-embed-text"),
        ("registry.ollama.ai/library/nomic-embed-text:latest", "nomic-embed-text"),
        ("Llama3.2:3B", "llama3.2:3b"),
        ("hf.co/org/repo:q4_k_m", "hf.co/org/repo:Q4_K_M"),
    ],
)
def test_names_are_normalised_as_the_store_does(asked: str, configured: str) -> None:
    config = parse(EXAMPLE)
    assert config.lookup(asked) is config.models[configured]


@pytest.mark.parametrize("asked", ["llama3.2", "llama3.2:1b", "other", "not a name!", ""])
def test_unconfigured_or_invalid_names_get_the_defaults(asked: str) -> None:
    assert parse(EXAMPLE).lookup(asked) is DEFAULT


def test_a_bare_name_means_latest() -> None:
    config = parse('[models."llama3.2"]\nnum_ctx = 4096\n')
    assert config.lookup("llama3.2:latest").num_ctx == 4096
    assert config.lookup("llama3.2:3b") is DEFAULT


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ('"10m"', 600.0),
        ('"1h30m"', 5400.0),
        ('"0"', 0.0),
        ("0", 0.0),
        ('"-1"', math.inf),
        ('"-1m"', math.inf),
        ("-1", math.inf),
        ('"300"', 300.0),  # whole seconds in a string, as OLLAMA_KEEP_ALIVE allows
        ("2.5", 2.5),
        ("inf", math.inf),
    ],
)
def test_keep_alive_values(value: str, seconds: float) -> None:
    assert parse(f"[models.m]\nkeep_alive = {value}\n").lookup("m").keep_alive == seconds


def test_kv_cache_types_both_sides_or_one() -> None:
    config = parse(
        '[models.a]\nkv_cache_type = "Q8_0"\n'
        '[models.b]\nkv_cache_type = "q8_0"\nkv_cache_type_v = "f16"\n'
        '[models.c]\nkv_cache_type_k = "q4_0"\n'
    )
    assert config.lookup("a") == ModelSettings(kv_cache_type="q8_0")
    assert config.lookup("b") == ModelSettings(kv_cache_type="q8_0", kv_cache_type_v="f16")
    assert config.lookup("c") == ModelSettings(kv_cache_type_k="q4_0")
    server = "q4_0"  # OLLAMA_KV_CACHE_TYPE
    assert requested_kv_types([config.lookup("a").kv_cache_types], server) == KvCacheTypes(
        "q8_0", "q8_0"
    )
    assert requested_kv_types([config.lookup("b").kv_cache_types], server) == KvCacheTypes(
        "q8_0", "f16"
    )
    assert requested_kv_types([config.lookup("c").kv_cache_types], "f16") == KvCacheTypes(
        "q4_0", "f16"
    )
    assert requested_kv_types([config.lookup("other").kv_cache_types], server) == KvCacheTypes(
        "q4_0", "q4_0"
    )


def test_gpus_match_by_index_or_id() -> None:
    settings = parse(EXAMPLE).lookup("llama3.2:3b")
    assert settings.allows(gpu(0, "GPU-aaaa"))
    assert settings.allows(gpu(3, "gpu-5D1E"))
    assert not settings.allows(gpu(1, "GPU-bbbb"))
    assert not parse(EXAMPLE).lookup("qwen2.5:0.5b").allows(gpu(0, "GPU-aaaa"))
    assert DEFAULT.allows(gpu(7, "GPU-cccc"))


def test_an_empty_file_configures_nothing() -> None:
    assert parse("").models == {}
    assert parse("[models]\n").models == {}


NOT_A_GPU = "is neither a GPU index (0, 1, …) nor a GPU id"
ERRORS = [
    (
        "[models.m\n",
        "invalid TOML: Expected ']' at the end of a table declaration (at line 1, column 10)",
    ),
    ("[server]\nport = 1\n", "server: unknown table (expected [models.NAME])"),
    ("models = 3\n", "models: must be a table of [models.NAME] tables"),
    ("[models]\nm = 3\n", "models.m: must be a table"),
    ('[models."bad name!"]\n', 'models."bad name!": invalid model name'),
    (
        '[models."llama3.2"]\n[models."Llama3.2:latest"]\n',
        'models."Llama3.2:latest": the same model as models."llama3.2"',
    ),
    (
        "[models.m]\nnum_paralel = 2\n",
        "models.m.num_paralel: unknown key (expected one of num_parallel, num_ctx, "
        "keep_alive, pinned, preload, gpus, prompt_cache, draft_num_predict, kv_cache_type, "
        "kv_cache_type_k, kv_cache_type_v, speculative)",
    ),
    (
        '[models.m]\nkv_cache_type_v = "q3_k"\n',
        "models.m.kv_cache_type_v: unknown KV cache type 'q3_k'; choose from f32, f16, bf16, "
        "q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1",
    ),
    ("[models.m]\nkv_cache_type = 8\n",
     "models.m.kv_cache_type: must be a KV cache type name, not integer"),
    ('[models.m]\nnum_parallel = "2"\n', "models.m.num_parallel: must be an integer, not string"),
    ("[models.m]\nnum_parallel = 0\n", "models.m.num_parallel: must be at least 1, not 0"),
    ("[models.m]\nnum_ctx = true\n", "models.m.num_ctx: must be an integer, not boolean"),
    ("[models.m]\nnum_ctx = 2048.0\n", "models.m.num_ctx: must be an integer, not float"),
    (
        '[models.m]\nkeep_alive = "10x"\n',
        'models.m.keep_alive: time: unknown unit "x" in duration "10x"',
    ),
    ('[models.m]\nkeep_alive = "soon"\n', 'models.m.keep_alive: time: invalid duration "soon"'),
    ("[models.m]\nkeep_alive = nan\n", "models.m.keep_alive: Unsupported keep_alive value: NaN"),
    (
        "[models.m]\nkeep_alive = true\n",
        "models.m.keep_alive: must be a duration string or a number of seconds, not boolean",
    ),
    ('[models.m]\npinned = "yes"\n', "models.m.pinned: must be true or false, not string"),
    ("[models.m]\npreload = 1\n", "models.m.preload: must be true or false, not integer"),
    (
        '[models.m]\ngpus = "all"\n',
        'models.m.gpus: must be an array of GPU indices or ids, or "cpu", not string',
    ),
    ("[models.m]\ngpus = [-1]\n", "models.m.gpus: -1 " + NOT_A_GPU),
    ("[models.m]\nprompt_cache = -1\n",
     "models.m.prompt_cache: must be 0 (off) or more MiB, not -1"),
    ("[models.m]\nprompt_cache = 1.5\n",
     "models.m.prompt_cache: must be a whole number of MiB, not float"),
    ("[models.m]\ngpus = [[0]]\n", "models.m.gpus: array " + NOT_A_GPU),
    (
        '[models.m]\npinned = true\nkeep_alive = "1h"\n',
        "models.m.keep_alive: a pinned model never expires; remove keep_alive or pinned",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "problem"), ERRORS, ids=[problem for _, problem in ERRORS])
def test_every_mistake_is_one_line_with_the_file_and_the_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert message == f"{PATH}: {problem}"
    assert "\n" not in message


def test_no_file_is_no_configuration() -> None:
    assert load_model_config(None) == ModelConfig()


def test_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ollamatrio.toml"
    path.write_text(EXAMPLE)
    assert load_model_config(path) == parse_model_config(EXAMPLE, path)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_model_config(path)
    assert str(caught.value) == f"{path}: cannot read: no such file or directory"


def test_a_folder_or_binary_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r": cannot read: is a directory$"):
        load_model_config(tmp_path)
    binary = tmp_path / "x.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"x\.toml: not UTF-8 text$"):
        load_model_config(binary)


def test_settings_take_the_path_from_ollamatrio_config() -> None:
    assert Settings.from_env({}).config_path is None
    assert Settings.from_env({"OLLAMATRIO_CONFIG": "  "}).config_path is None
    path = Settings.from_env({"OLLAMATRIO_CONFIG": "/srv/o.toml"}).config_path
    assert path == Path("/srv/o.toml")


def test_the_example_in_the_docs_parses() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs" / "scheduling.md"
    (example,) = re.findall(r"```toml\n(.*?)```", docs.read_text(), re.DOTALL)
    config = parse(example)
    assert config.lookup("llama3.2:3b") == ModelSettings(
        num_parallel=4,
        num_ctx=16384,
        keep_alive=3600.0,
        preload=True,
        gpus=(0, 1),
        prompt_cache=2048,
        draft_num_predict=6,
        speculative="off",
    )
    assert config.lookup("nomic-embed-text:latest") == ModelSettings(
        pinned=True, preload=True, gpus=()
    )
    assert config.preloads == ["llama3.2:3b", "nomic-embed-text"]
