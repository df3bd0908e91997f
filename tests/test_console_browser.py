"""The console (``GET /ui``) in a real browser: headless Chromium from the system's packages,
driven by Playwright (tests/helpers/browser.py), against a real server on an ephemeral port
with the simulated engine.  The page loads with no JavaScript error; another client's request
makes its model appear with its load's progress, then ``ready``; an unload from the page
empties the list; the playground streams an answer; a pull shows its progress.  With keys
required it asks for one and hides the admin's actions from a key without the scope; served
by a fleet's gateway it shows every host."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
from helpers.browser import in_browser, open_page, wait_until
from test_fleet_gateway import fleet

from ollamatrio.auth.keys import KeyStore
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.store.manifest import MEDIA_MODEL, MEDIA_TEMPLATE
from ollamatrio.testing.fake_registry import FakeRegistry

if TYPE_CHECKING:
    from conftest import ServerFactory, TinyGGUF

pytestmark = pytest.mark.browser

TIMEOUT = 60  # each test's limit; each takes a few seconds


def expect_no_problems(errors: list[str]) -> None:
    assert errors == [], errors


async def test_the_page_loads_with_every_panel_and_no_error(api_server: ServerFactory) -> None:
    with trio.fail_after(TIMEOUT):
        async with api_server() as srv:

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    for title in ("Models", "Devices", "Activity", "Store", "Playground"):
                        expect(page.get_by_role("heading", name=title, exact=True)).to_be_visible()
                    expect(page.locator("#models-empty")).to_be_visible()
                    expect(page.locator("#store-list tr[data-model='tiny:latest']")).to_be_visible()
                    expect(
                        page.locator("#store-list tr[data-model='tiny:latest'] .caps")
                    ).to_have_text(re.compile("completion"))
                    expect(page.locator(".device[data-device=host]")).to_be_visible()
                    expect(page.locator("#link")).to_have_text("live")
                    expect(page.locator("#pull-form")).to_be_visible()  # no keys: every action
                    expect(page.locator("#chat-model")).to_have_value(re.compile("tiny"))
                    page.keyboard.press("Tab")  # the first stop is the skip link
                    assert page.evaluate("document.activeElement.className") == "skip"
                    # A phone's width, and 200 % zoom of a 1280 px window (640 CSS px): the
                    # panels stack, and nothing makes the page scroll sideways.
                    for width in (390, 640):
                        page.set_viewport_size({"width": width, "height": 800})
                        wide = page.evaluate("document.documentElement.scrollWidth")
                        assert wide <= width, (width, wide)
                    return problems.errors

            expect_no_problems(await in_browser(scenario))


async def test_another_clients_request_shows_the_load_then_ready(api_server: ServerFactory) -> None:
    behaviour = SimulatedBehaviour(load_seconds=2.0, tokens_per_second=2000)
    gpu = {"id": "sim0", "library": "CUDA", "total": 4 << 30, "compute": "8.6"}
    with trio.fail_after(TIMEOUT):
        async with (
            api_server(behaviour=behaviour, gpus=[gpu]) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
            trio.open_nursery() as nursery,
        ):

            async def another_client() -> None:
                await client.post(
                    "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False}
                )

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    expect(page.locator("#link")).to_have_text("live")
                    trio.from_thread.run_sync(nursery.start_soon, another_client)
                    card = page.locator("li.model[data-model='|tiny:latest']")
                    expect(card).to_have_attribute("data-state", "loading")
                    progress = card.locator("progress")
                    expect(progress).to_be_visible()
                    wait_until(page, "document.querySelector('li.model progress')?.value > 0")
                    expect(page.locator("#loads progress")).to_be_visible()
                    expect(card).to_have_attribute("data-state", "ready", timeout=20_000)
                    expect(card.locator(".badge")).to_have_text("ready")
                    expect(progress).to_be_hidden()
                    expect(page.locator("#events li[data-kind=loaded]")).to_contain_text("tiny")
                    # Its memory on the GPU's bar, beside the GPU's reserve.
                    legend = page.locator(".device[data-device=sim0] .legend")
                    expect(legend).to_contain_text("tiny:latest")
                    expect(legend).to_contain_text("reserve")
                    expect(card).to_contain_text("100% GPU")
                    return problems.errors

            expect_no_problems(await in_browser(scenario))


async def test_an_unload_from_the_page_empties_the_list(api_server: ServerFactory) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            api_server() as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
        ):
            await client.post(
                "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False}
            )

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    card = page.locator("li.model")
                    expect(card).to_have_count(1)
                    expect(card).to_have_attribute("data-state", "ready")
                    card.get_by_role("button", name="Unload").click()
                    expect(card).to_have_count(0)
                    expect(page.locator("#models-empty")).to_be_visible()
                    expect(page.locator("#events li[data-kind=unloaded]")).to_contain_text("tiny")
                    return problems.errors

            expect_no_problems(await in_browser(scenario))
            assert (await client.get("/api/ps")).json()["models"] == []


async def test_the_playground_streams_an_answer(api_server: ServerFactory) -> None:
    # 16 tokens at 10 a second: the answer is seen growing before it ends.
    behaviour = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=10)
    with trio.fail_after(TIMEOUT):
        async with api_server(behaviour=behaviour) as srv:

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    page.select_option("#chat-model", "tiny:latest")
                    page.fill("#chat-input", "Tell me something")
                    page.keyboard.press("Control+Enter")  # from the message box
                    answer = page.locator(".message.assistant .text")
                    expect(answer).not_to_be_empty()
                    expect(page.locator("#chat-stop")).to_be_enabled()  # still streaming
                    partial = answer.inner_text()
                    expect(page.locator("#chat-stats")).to_contain_text("tokens/s", timeout=20_000)
                    assert len(answer.inner_text()) > len(partial)
                    expect(page.locator("#chat-stats")).to_contain_text("reused from the cache")
                    expect(page.locator(".message.user .text")).to_have_text("Tell me something")
                    return problems.errors

            expect_no_problems(await in_browser(scenario))


async def test_a_pull_shows_its_progress(
    api_server: ServerFactory, tiny_gguf: TinyGGUF, nursery: trio.Nursery
) -> None:
    registry = FakeRegistry(chunk_delay=0.02)  # 64 KiB chunks: the bar moves for a second
    await nursery.start(registry.serve)
    weights = tiny_gguf(seed=5).read_bytes() + bytes(3 << 20)
    registry.add_model(
        "library/pulled:latest", [(MEDIA_MODEL, weights), (MEDIA_TEMPLATE, b"{{ .Prompt }}")]
    )
    name = registry.model_name("library/pulled:latest")
    digest = hashlib.sha256(weights).hexdigest()
    with trio.fail_after(TIMEOUT):
        async with api_server() as srv:

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    page.fill("#pull-name", name)
                    page.check("#pull-insecure")
                    page.get_by_role("button", name="Pull", exact=True).click()
                    box = page.locator(".pull")
                    expect(box.locator("p")).to_contain_text(
                        re.compile(rf"pulling {digest[:12]}: \d+%")
                    )
                    wait_until(
                        page,
                        "(() => { const p = document.querySelector('.pull progress');"
                        " return p && p.value > 0 && p.value < p.max; })()",
                    )
                    expect(box).to_have_attribute("data-done", "success", timeout=30_000)
                    expect(page.locator("#store-list tr", has_text="pulled")).to_be_visible()
                    return problems.errors

            expect_no_problems(await in_browser(scenario))


async def test_with_keys_the_page_asks_for_one_and_hides_what_it_may_not_do(
    api_server: ServerFactory, tmp_path: Path
) -> None:
    def make_keys() -> dict[str, str]:
        store = KeyStore.in_folder(tmp_path / "state")
        return {scope: store.create(scope, [scope])[1] for scope in ("inference", "admin")}

    keys = await trio.to_thread.run_sync(make_keys)
    with trio.fail_after(TIMEOUT):
        async with api_server(auth="required", data_dir=tmp_path / "state") as srv:

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url, ready=False) as (page, problems):
                    dialog = page.get_by_role("dialog", name="API key")
                    expect(dialog).to_be_visible()
                    page.fill("#key-input", keys["inference"])
                    page.keyboard.press("Enter")
                    page.wait_for_selector("body[data-ready=true]")
                    expect(page.locator("#link")).to_have_text("live")
                    expect(page.locator("#store-list tr[data-model='tiny:latest']")).to_be_visible()
                    expect(page.locator("#pull-form")).to_be_hidden()  # admin's
                    expect(page.locator("#store-list .delete").first).to_be_hidden()
                    expect(page.locator("#charts")).to_contain_text("metrics scope")
                    # The key is kept: a reload asks for none.
                    page.reload()
                    page.wait_for_selector("body[data-ready=true]")
                    expect(dialog).to_be_hidden()
                    page.get_by_role("button", name="API key…").click()
                    page.fill("#key-input", keys["admin"])
                    with page.expect_navigation():  # another key: the page starts again
                        page.keyboard.press("Enter")
                    page.wait_for_selector("body[data-ready=true]")
                    expect(page.locator("#pull-form")).to_be_visible()
                    expect(page.locator("#store-list .delete").first).to_be_visible()
                    return problems.errors

            errors = await in_browser(scenario)
    # The browser reports each refused probe (the first 401, the inference key's 403s);
    # nothing else.
    assert errors, "the refusals should have been seen"
    refused = re.compile(r"status of (401|403)")
    assert [e for e in errors if not refused.search(e)] == []


async def test_a_fleets_gateway_shows_every_host_and_its_models(
    api_server: ServerFactory, tiny_gguf: TinyGGUF, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            fleet(api_server, tiny_gguf, tmp_path) as (hosts, gw),
            httpx.AsyncClient(base_url=gw.url, timeout=30) as client,
        ):
            for model in ("tiny", "other"):
                body = {"model": model, "prompt": "hi", "stream": False}
                (await client.post("/api/generate", json=body)).raise_for_status()

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(gw.url) as (page, problems):
                    expect(page.locator("#fleet")).to_be_visible()
                    cards = page.locator("#fleet-list li")
                    expect(cards).to_have_count(2)
                    for host in hosts:
                        expect(
                            page.locator(f"#fleet-list li[data-host='{host.url}']")
                        ).to_contain_text("up")
                    expect(page.locator("#fleet-list")).to_contain_text("tiny:latest (ready)")
                    expect(page.locator("#fleet-list")).to_contain_text("other:latest (ready)")
                    expect(page.locator("li.model")).to_have_count(2)
                    expect(page.locator("li.model").first).to_contain_text(" on http://127.0.0.1:")
                    expect(page.locator("#devices")).to_contain_text("its own devices")
                    return problems.errors

            expect_no_problems(await in_browser(scenario))


@pytest.mark.slow
async def test_the_playground_with_smollm2_says_what_the_cache_reused(
    api_server: ServerFactory, smollm2_path: Path
) -> None:
    """The real model in a real runner: the answer streams, and the second question of the
    chat reuses the first one's prompt from the runner's cache (the stats say how much)."""
    from ollamatrio.engines.process import ProcessEngineFactory

    engines = ProcessEngineFactory(load_timeout=120)
    with trio.fail_after(240):
        async with api_server(engines=engines, models={"smol": smollm2_path}) as srv:

            def scenario() -> list[str]:
                from playwright.sync_api import expect

                with open_page(srv.url) as (page, problems):
                    page.select_option("#chat-model", "smol:latest")
                    stats = page.locator("#chat-stats")
                    reused = re.compile(r"prompt (\d+) tokens, (\d+) of them reused")
                    counts = []
                    for question in ("What is the capital of France?", "And of Italy?"):
                        page.fill("#chat-input", question)
                        page.click("#chat-send")
                        expect(stats).to_contain_text("tokens/s", timeout=120_000)
                        match = reused.search(stats.inner_text())
                        assert match, stats.inner_text()
                        counts.append((int(match[1]), int(match[2])))
                    expect(page.locator(".message.assistant .text")).to_have_count(2)
                    assert page.locator(".message.assistant .text").first.inner_text().strip()
                    (_, first_reused), (second_prompt, second_reused) = counts
                    assert second_reused > first_reused  # the first exchange, from the cache
                    assert second_reused < second_prompt
                    expect(page.locator("li.model[data-model='|smol:latest']")).to_have_attribute(
                        "data-state", "ready"
                    )
                    return problems.errors

            expect_no_problems(await in_browser(scenario))
