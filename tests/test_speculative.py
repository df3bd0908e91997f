"""Speculative decoding's option and counts: the ``speculative`` option everywhere it can be
set (request options, ``/v1`` extra fields, Modelfile ``PARAMETER``, the TOML model config),
the drafter it loads and the reload a different one causes, and ``draft_count`` /
``draft_accepted_count`` from the runner's timings to the native final chunk, ``/v1``'s
``completion_tokens_details`` and ``/metrics``.  The simulated engine stands in for the
runner; tests/test_speculative_real.py runs llama.cpp's drafter."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_metrics
import trio

from ollamatrio import speculative
from ollamatrio.api.bodies import check_option, merge_options
from ollamatrio.api.native.wire import timings as native_timings
from ollamatrio.api.openai.wire import usage_counts
from ollamatrio.engines.llamacpp_wire import timing_counts
from ollamatrio.engines.simulated import ngram_drafts
from ollamatrio.errors import InvalidRequestError
from ollamatrio.generation.relay import Timings
from ollamatrio.model_config import ConfigError, parse_model_config
from ollamatrio.modelfile import ModelfileError, format_modelfile, parse_modelfile
from ollamatrio.scheduler.options import needs_reload, resolve_load_options

# -- the option --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode"), [("auto", "auto"), ("off", "off"), ("NGRAM", "ngram"), (" draft ", "draft")]
)
def test_modes_parse_case_insensitively(value: str, mode: str) -> None:
    assert speculative.parse_mode(value) == mode


@pytest.mark.parametrize("value", ["", "on", "eagle", 1, True, None, ["ngram"]])
def test_other_values_are_refused_naming_the_choices(value: Any) -> None:
    with pytest.raises(speculative.SpeculativeError, match='"auto", "off", "ngram", "draft"'):
        speculative.parse_mode(value)


def test_the_drafter_each_mode_loads() -> None:
    assert speculative.drafter_for("off") == "none"
    assert speculative.drafter_for("ngram") == "ngram"
    assert speculative.drafter_for("auto") == "ngram"
    assert speculative.drafter_for("auto", has_draft_model=True) == "draft"
    assert speculative.drafter_for("ngram", has_draft_model=True) == "ngram"
    assert speculative.drafter_for("draft", has_draft_model=True) == "draft"
    with pytest.raises(speculative.SpeculativeError, match="needs a draft model"):
        speculative.drafter_for("draft")


def test_request_options_are_checked_and_normalised() -> None:
    assert check_option("speculative", "Off") == "off"
    assert merge_options({"speculative": "ngram"}, {"speculative": "off"}) == {"speculative": "off"}
    with pytest.raises(InvalidRequestError, match="option speculative must be one of"):
        merge_options({"speculative": "fast"})
    with pytest.raises(InvalidRequestError):
        check_option("speculative", 2)


# -- load options and reloads ------------------------------------------------------------


def resolve(options: dict[str, Any], **kw: Any) -> Any:
    return resolve_load_options(
        options, default_num_ctx=4096, context_length_configured=False, train_ctx=8192,
        num_parallel=1, embedding_only=False, **kw,
    )  # fmt: skip


def test_the_load_takes_the_request_option_over_the_configured_default() -> None:
    assert resolve({}).drafter == "ngram"  # auto
    assert resolve({}, speculative_default="off").drafter == "none"
    assert resolve({"speculative": "ngram"}, speculative_default="off").drafter == "ngram"
    assert resolve({"speculative": "off"}).drafter == "none"
    assert resolve({}, has_draft_model=True).drafter == "draft"


def test_draft_without_a_draft_model_is_a_400() -> None:
    with pytest.raises(InvalidRequestError, match='"draft" needs a draft model'):
        resolve({"speculative": "draft"})


def test_embedding_mode_drafts_nothing() -> None:
    assert resolve({"speculative": "ngram"}, embeddings=True).drafter == "none"


def test_another_drafter_reloads_the_same_one_does_not() -> None:
    auto = resolve({})
    assert not needs_reload(auto, resolve({"speculative": "ngram"}))  # the same drafter
    assert needs_reload(auto, resolve({"speculative": "off"}))
    assert needs_reload(resolve({"speculative": "off"}), auto)


def test_embedding_mode_and_drafting_never_reload_back_and_forth() -> None:
    embedding = resolve({}, embeddings=True)
    assert not needs_reload(embedding, resolve({}))  # it generates too, without drafting
    assert needs_reload(resolve({}), embedding)  # as before: embeddings need the mode


# -- the Modelfile and the model config ---------------------------------------------------


def test_a_modelfile_parameter_round_trips() -> None:
    mf = parse_modelfile("FROM ./m.gguf\nPARAMETER speculative Off\nPARAMETER stop a\n")
    assert mf.parameters == {"speculative": "off", "stop": ["a"]}
    shown = format_modelfile(mf)
    assert "PARAMETER speculative off" in shown
    assert parse_modelfile(shown).parameters["speculative"] == "off"


def test_a_bad_modelfile_value_names_its_line() -> None:
    with pytest.raises(ModelfileError, match="invalid value 'sometimes' for parameter speculative"):
        parse_modelfile("FROM ./m.gguf\n\nPARAMETER speculative sometimes\n")


def test_the_model_config_sets_a_default() -> None:
    config = parse_model_config('[models.a]\nspeculative = "off"\n', Path("/c.toml"))
    assert config.lookup("a").speculative == "off"
    assert config.lookup("b").speculative is None
    with pytest.raises(ConfigError, match=r"speculative.*must be one of"):
        parse_model_config('[models.a]\nspeculative = "yes"\n', Path("/c.toml"))


# -- counts -------------------------------------------------------------------------------


def test_timings_carry_draft_counts_only_from_a_runner_that_drafts() -> None:
    plain = timing_counts({"predicted_n": 10, "predicted_ms": 100.0})
    assert plain["draft_count"] is None
    assert plain["draft_accepted_count"] is None
    drafted = timing_counts({"predicted_n": 10, "draft_n": 12, "draft_n_accepted": 7})
    assert (drafted["draft_count"], drafted["draft_accepted_count"]) == (12, 7)


def test_native_final_and_openai_usage_show_the_counts() -> None:
    base = Timings(1, 0, 5, 1, 10, 1)
    assert "draft_count" not in native_timings(base)
    counted = native_timings(replace(base, draft_count=12, draft_accepted_count=7))
    assert list(counted)[:6] == [  # Ollama's fields first, unchanged
        "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
        "eval_count", "eval_duration",
    ]  # fmt: skip
    assert (counted["draft_count"], counted["draft_accepted_count"]) == (12, 7)
    assert "completion_tokens_details" not in usage_counts(5, 10, 0)
    assert usage_counts(5, 10, 0, 12, 7)["completion_tokens_details"] == {
        "draft_count": 12,
        "draft_accepted_count": 7,
    }


def test_the_simulated_drafter_counts_what_it_proposes_and_what_matches() -> None:
    prompt = ["a", "b", "c", "d", "a", "b"]
    assert ngram_drafts(prompt, ["c", "d"]) == (2, 2)  # "b" was followed by "c", then "d"
    assert ngram_drafts(prompt, ["x", "y"]) == (1, 0)  # "x" never seen: no draft after it
    assert ngram_drafts([], []) == (0, 0)


# -- through the server (simulated engine) ------------------------------------------------


async def generate(c: httpx.AsyncClient, options: dict[str, Any]) -> httpx.Response:
    return await c.post(
        "/api/generate",
        json={"model": "tiny", "prompt": "one two one two one", "stream": False,
              "options": {"num_predict": 8, **options}},
    )  # fmt: skip


async def test_counts_reach_the_final_chunk_usage_and_metrics(api_server: Any) -> None:
    async with test_metrics.serving(api_server) as (_, c):
        final = (await generate(c, {})).json()
        assert final["draft_count"] >= final["draft_accepted_count"] >= 0
        assert final["draft_count"] > 0
        v1 = (await c.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 6, "messages": [{"role": "user", "content": "x"}],
        })).json()  # fmt: skip
        details = v1["usage"]["completion_tokens_details"]
        samples = await test_metrics.scrape(c)
    drafted = final["draft_count"] + details["draft_count"]
    accepted = final["draft_accepted_count"] + details["draft_accepted_count"]
    value = test_metrics.value
    assert value(samples, "ollamatrio_draft_tokens_total", model="tiny:latest") == drafted
    assert value(samples, "ollamatrio_draft_tokens_accepted_total", model="tiny:latest") == accepted


async def test_off_drafts_nothing_and_a_switch_reloads(api_server: Any) -> None:
    async with test_metrics.serving(api_server) as (_, c):
        assert "draft_count" in (await generate(c, {"speculative": "ngram"})).json()
        off = (await generate(c, {"speculative": "off"})).json()
        assert "draft_count" not in off
        assert off["load_duration"] > 0  # the runner was loaded again, without a drafter
        again = (await generate(c, {"speculative": "off"})).json()
        assert again["load_duration"] == 0


async def test_draft_without_a_draft_model_is_refused(api_server: Any) -> None:
    async with test_metrics.serving(api_server) as (_, c):
        r = await generate(c, {"speculative": "draft"})
        assert r.status_code == 400
        assert "needs a draft model" in r.json()["error"]
        r = await c.post("/v1/chat/completions", json={
            "model": "tiny", "speculative": "draft",
            "messages": [{"role": "user", "content": "x"}],
        })  # fmt: skip
        assert r.status_code == 400
        assert "needs a draft model" in r.json()["error"]["message"]


async def test_v1_takes_the_option_from_extra_fields(api_server: Any) -> None:
    async with test_metrics.serving(api_server) as (_, c):
        with trio.fail_after(10):
            r = await c.post("/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 4, "speculative": "off",
                "messages": [{"role": "user", "content": "x"}],
            })  # fmt: skip
        assert r.status_code == 200, r.text
        assert "completion_tokens_details" not in r.json()["usage"]


def test_module_is_json_free() -> None:
    # The option's values are plain strings: a request body carries them as they are.
    assert json.loads(json.dumps(list(speculative.MODES))) == ["auto", "off", "ngram", "draft"]


async def test_a_model_parameter_sets_the_default_and_show_lists_it(api_server: Any) -> None:
    async with test_metrics.serving(api_server) as (_, c):
        created = await c.post("/api/create", json={
            "model": "tiny-plain", "from": "tiny", "stream": False,
            "parameters": {"speculative": "off"},
        })  # fmt: skip
        assert created.status_code == 200, created.text
        shown = (await c.post("/api/show", json={"model": "tiny-plain"})).json()
        assert 'speculative                    "off"' in shown["parameters"]
        assert "PARAMETER speculative off" in shown["modelfile"]
        body = {"model": "tiny-plain", "prompt": "one two one two", "stream": False,
                "options": {"num_predict": 6}}  # fmt: skip
        assert "draft_count" not in (await c.post("/api/generate", json=body)).json()
        body["options"] = {"num_predict": 6, "speculative": "ngram"}  # the request wins
        assert "draft_count" in (await c.post("/api/generate", json=body)).json()
        bad = await c.post("/api/create", json={
            "model": "tiny-bad", "from": "tiny", "parameters": {"speculative": "always"},
        })  # fmt: skip
        assert bad.status_code == 400
