"""The chat page (llamactx/server/static/) in headless Chromium against a real `llamactx serve` process.

Debian's /usr/bin/chromium drives the page through playwright (`make test` installs it; playwright's own browser
downloads do not work here). Without it these tests fail, they never skip. Every wait is bounded, and the server
processes are stopped in their fixtures' teardown whatever happens.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, Response, expect, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
START_TIMEOUT_S = 120
ANSWER_TIMEOUT_MS = 90_000  # SmolLM2 on two shared cores: an answer of a few dozen tokens, generously bounded
UI_TIMEOUT_MS = 10_000
API_KEY = "secret"
COMPLETIONS = "**/v1/chat/completions"


@dataclass
class Server:
    url: str
    log: Path
    api_key: str | None = None

    def get(self, path: str) -> dict:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=headers), timeout=10) as r:
            return json.load(r)

    def post_error(self, path: str, body: dict) -> dict:
        """The JSON error body of a request that the server refuses."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        return json.load(refused.value)

    def model_id(self) -> str:
        return self.get("/v1/models")["data"][0]["id"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def llamactx_serve(log: Path, *args: str) -> Iterator[Server]:
    """`python -m llamactx serve` on a free port of 127.0.0.1 until /health answers 200; killed on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llamactx", "serve", "--port", str(port), *args],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                exited = proc.poll() is not None
                why = f"exited with {proc.returncode}" if exited else f"was not healthy in {START_TIMEOUT_S} s"
                pytest.fail(f"llamactx serve {why}; its output:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.2)
        yield Server(url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def webui_server(tmp_path_factory) -> Iterator[Server]:
    with llamactx_serve(tmp_path_factory.mktemp("webui") / "serve.log") as server:
        yield server


@pytest.fixture
def keyed_server(tmp_path) -> Iterator[Server]:
    with llamactx_serve(tmp_path / "serve.log", "--api-key", API_KEY) as server:
        server.api_key = API_KEY
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the web page tests need Debian's chromium "
                    "(`apt-get install -y chromium`, which `make test` runs as root); they do not skip")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context per test: its own localStorage, so no settings leak between tests."""
    context = browser.new_context()
    context.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


# -- driving the page ---------------------------------------------------------------------------------------------


def set_setting(page: Page, name: str, value: str) -> None:
    if page.locator("#settings").get_attribute("open") is None:
        page.click("#settings-toggle")
    page.fill(f"#{name}", value)


def ask(page: Page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def assistant(page: Page, i: int = -1) -> Locator:
    answers = page.locator('#messages .message[data-role="assistant"]')
    return answers.last if i == -1 else answers.nth(i)


def wait_for_answer(answer: Locator) -> str:
    """The stats line once the answer has finished; fails if it never shows a tokens/s figure."""
    stats = answer.locator(".stats")
    expect(stats).to_contain_text(re.compile(r"\d+\.\d tokens/s"), timeout=ANSWER_TIMEOUT_MS)
    return stats.inner_text()


def record_answer_lengths(page: Page) -> None:
    """Records, in the page, each new length of the last assistant message while it streams."""
    page.evaluate("""() => {
        window.answerLengths = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll('#messages .message[data-role="assistant"] .content');
            const n = answers.length ? answers[answers.length - 1].textContent.length : 0;
            const seen = window.answerLengths;
            if (n > 0 && n !== seen[seen.length - 1]) seen.push(n);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }""")


def streamed_text(response: Response) -> tuple[str, dict]:
    """The content deltas of an SSE chat response joined, and its last `timings`."""
    text, timings = "", {}
    for line in response.text().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        for choice in event.get("choices", []):
            text += choice["delta"].get("content") or ""
        timings = event.get("timings", timings)
    return text, timings


# -- the tests ----------------------------------------------------------------------------------------------------


def test_answer_streams_into_the_page_with_its_speed_and_a_second_turn_sends_the_conversation(page, webui_server):
    page.goto(webui_server.url)
    expect(page.locator("#model-name")).to_have_text(webui_server.model_id())
    set_setting(page, "temperature", "0")
    set_setting(page, "max_tokens", "32")
    record_answer_lengths(page)

    with page.expect_response(COMPLETIONS, timeout=ANSWER_TIMEOUT_MS) as first:
        ask(page, "Name three colors.")
    stats = wait_for_answer(assistant(page))
    sent = first.value.request.post_data_json
    assert sent["messages"] == [{"role": "user", "content": "Name three colors."}]
    assert (sent["stream"], sent["temperature"], sent["max_tokens"]) == (True, 0, 32)

    shown = assistant(page).locator(".content").text_content()
    streamed, timings = streamed_text(first.value)
    assert shown == streamed and shown.strip()
    lengths = page.evaluate("window.answerLengths")
    assert len(lengths) >= 2 and lengths == sorted(lengths) and lengths[-1] == len(shown)  # it grew while streaming
    assert f"{timings['predicted_per_second']:.1f} tokens/s" in stats
    assert f"{timings['predicted_n']} tokens generated" in stats
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()

    markup = "Name one more. <b>Just one.</b>"  # shown as text, never parsed as HTML
    with page.expect_response(COMPLETIONS, timeout=ANSWER_TIMEOUT_MS) as second:
        ask(page, markup)
    wait_for_answer(assistant(page, 1))
    assert second.value.request.post_data_json["messages"] == [
        {"role": "user", "content": "Name three colors."},
        {"role": "assistant", "content": shown},
        {"role": "user", "content": markup},
    ]
    assert assistant(page, 1).locator(".content").text_content().strip()
    users = page.locator('#messages .message[data-role="user"] .content')
    expect(users).to_have_text(["Name three colors.", markup])
    expect(page.locator("#messages b")).to_have_count(0)

    page.click("#new-chat")
    expect(page.locator("#messages .message")).to_have_count(0)


def test_stop_keeps_the_partial_answer_frees_the_slot_and_send_works_again(page, webui_server):
    page.goto(webui_server.url)
    set_setting(page, "temperature", "0")
    set_setting(page, "max_tokens", "2000")
    record_answer_lengths(page)
    ask(page, "Count from 1 to 500, separated by commas.")

    grown = "() => window.answerLengths.length >= 3"  # three different lengths: the answer is streaming
    page.wait_for_function(grown, timeout=ANSWER_TIMEOUT_MS, polling=50)
    expect(page.locator("#send")).to_be_disabled()
    page.click("#stop")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    answer = assistant(page)
    expect(answer.locator(".stats")).to_have_text("stopped: partial answer kept")
    partial = answer.locator(".content").text_content()
    assert partial.strip()
    page.wait_for_timeout(1500)
    assert answer.locator(".content").text_content() == partial  # no more text after Stop

    deadline = time.monotonic() + 10  # the server cancelled the sequence when the connection closed
    while any(s["is_processing"] for s in webui_server.get("/slots")):
        assert time.monotonic() < deadline, "a slot is still generating 10 s after Stop"
        time.sleep(0.2)

    set_setting(page, "max_tokens", "8")
    with page.expect_response(COMPLETIONS, timeout=ANSWER_TIMEOUT_MS) as follow_up:
        ask(page, "Thanks.")
    wait_for_answer(assistant(page, 1))
    assert follow_up.value.request.post_data_json["messages"][1] == {"role": "assistant", "content": partial}


def test_an_http_error_shows_the_servers_message_and_gives_the_turn_back(page, webui_server):
    page.goto(webui_server.url)
    expect(page.locator("#model-name")).to_have_text(webui_server.model_id())
    page.fill("#input", "line one")
    page.press("#input", "Shift+Enter")  # a new line, not a send
    page.keyboard.type("line two")
    expect(page.locator("#input")).to_have_value("line one\nline two")
    expect(page.locator("#messages .message")).to_have_count(0)

    set_setting(page, "seed", "1.5")
    ask(page, "Hi")

    refused = webui_server.post_error("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "seed": 1.5})
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("HTTP 400: " + refused["error"]["message"])
    expect(page.locator("#messages .message")).to_have_count(0)
    expect(page.locator("#input")).to_have_value("Hi")


def test_with_an_api_key_the_page_shows_the_authentication_error_until_the_key_is_entered(page, keyed_server):
    page.goto(keyed_server.url)
    error = page.locator("#error")
    expect(error).to_contain_text("HTTP 401: Invalid API Key", timeout=30_000)
    expect(page.locator("#model-name")).to_have_text("unknown")
    expect(page.locator("#api-key")).to_be_visible()  # the settings opened themselves on the 401

    set_setting(page, "max_tokens", "16")
    ask(page, "Name three colors.")
    expect(error).to_contain_text("HTTP 401: Invalid API Key")
    expect(page.locator("#messages .message")).to_have_count(0)

    page.fill("#api-key", API_KEY)
    expect(page.locator("#model-name")).to_have_text(keyed_server.model_id())
    expect(error).to_be_hidden()
    with page.expect_response(COMPLETIONS, timeout=ANSWER_TIMEOUT_MS) as answered:
        page.press("#input", "Enter")  # the refused message was given back to the input box
    wait_for_answer(assistant(page))
    assert answered.value.request.headers["authorization"] == f"Bearer {API_KEY}"
    assert answered.value.status == 200

    page.reload()  # the key is remembered
    expect(page.locator("#model-name")).to_have_text(keyed_server.model_id())
    expect(page.locator("#api-key")).to_have_value(API_KEY)


def test_serve_warns_when_any_origin_may_call_it_without_a_key(webui_server, keyed_server):
    """llama-server's default CORS (any origin) and its security line on stderr at start, unless an API key is set."""
    assert "no API key is set and CORS allows all origins" in webui_server.log.read_text(errors="replace")
    assert "CORS allows all origins" not in keyed_server.log.read_text(errors="replace")
