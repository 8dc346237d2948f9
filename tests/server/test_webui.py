"""The chat page (llamactx/server/static/) in headless Chromium against a real `llamactx serve` process: answers
stream in, Stop, errors and the API key; an answer's thinking (`reasoning_content`) shown apart and collapsed, its
Markdown rendered (code blocks with their language, tables, links) with the model's HTML shown as text; the
conversations kept across a reload, switched, started and deleted. The thinking / Markdown answer is a canned SSE
stream the page's fetch gets through playwright's route (the embedded SmolLM2 does not think).

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


def answer_text(answer: Locator) -> str:
    """The answer's text as the model wrote it (the page shows it rendered as Markdown)."""
    return answer.locator(".content").get_attribute("data-raw")


def record_answer_lengths(page: Page) -> None:
    """Records, in the page, each new length of the last assistant message while it streams."""
    page.evaluate("""() => {
        window.answerLengths = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll('#messages .message[data-role="assistant"] .content');
            const n = answers.length ? (answers[answers.length - 1].dataset.raw || "").length : 0;
            const seen = window.answerLengths;
            if (n > 0 && n !== seen[seen.length - 1]) seen.push(n);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true,
                                                         attributes: true, attributeFilter: ['data-raw']});
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

    shown = answer_text(assistant(page))
    streamed, timings = streamed_text(first.value)
    assert shown == streamed and shown.strip()
    assert assistant(page).locator(".content").text_content().strip()  # rendered
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
    assert answer_text(assistant(page, 1)).strip()
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
    partial = answer_text(answer)
    assert partial.strip()
    page.wait_for_timeout(1500)
    assert answer_text(answer) == partial  # no more text after Stop

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


# -- thinking, Markdown and the kept conversations (a canned stream) ---------------------------------------------

THOUGHT = ["Let me think", " about <b>this</b>."]
ANSWER = ['# Answer\n\nHere is **bold** and `inline`:\n\n```python\nprint("<script>")\n```\n',
          '\n<script>window.pwned = 1</script> <img src=x onerror="window.pwned = 2">\n\n'
          "| a | b |\n|---|:-:|\n| 1 | `x` |\n\n- one\n- [safe](https://example.com/)\n- [unsafe](javascript:alert(1))"]
TIMINGS = {"predicted_per_second": 12.5, "predicted_n": 7, "prompt_n": 3, "cache_n": 0}


def canned_sse(thought: list[str], answer: list[str]) -> str:
    """A chat completion's SSE body as llama-server streams it: reasoning_content deltas, then content deltas."""
    events = [{"delta": {"role": "assistant", "content": None}}]
    events += [{"delta": {"reasoning_content": piece}} for piece in thought]
    events += [{"delta": {"content": piece}} for piece in answer]
    lines = [{"object": "chat.completion.chunk", "choices": [{"index": 0, "finish_reason": None, **e}]}
             for e in events]
    lines.append({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                  "timings": TIMINGS})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in lines) + "data: [DONE]\n\n"


STATIC = Path(__file__).parents[2] / "llamactx" / "server" / "static"
CANNED_ORIGIN = "http://llamactx.test"
MIME = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def answer_cannedly(page: Page, thought: list[str], answer: list[str]) -> list[dict]:
    """Serves the page at CANNED_ORIGIN from the files the server serves (llamactx/server/static/, routed in the
    browser: no model to load), a model in /v1/models, and a canned stream to every chat request; returns the list
    the request bodies are put in."""
    sent: list[dict] = []

    def serve(route):
        path = route.request.url[len(CANNED_ORIGIN):].split("?")[0]
        if path == "/v1/chat/completions":
            sent.append(route.request.post_data_json)
            route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=canned_sse(thought, answer))
        elif path == "/v1/models":
            route.fulfill(status=200, json={"object": "list", "data": [{"id": "canned", "object": "model"}]})
        else:
            file = STATIC / ("index.html" if path == "/" else path.removeprefix("/static/"))
            route.fulfill(status=200, headers={"Content-Type": MIME[file.suffix]}, body=file.read_bytes())

    page.route(f"{CANNED_ORIGIN}/**", serve)
    return sent


def check_rendered_answer(answer: Locator) -> None:
    thinking = answer.locator("details.thinking")
    expect(thinking).to_be_visible()
    assert thinking.get_attribute("open") is None  # collapsed
    expect(thinking.locator(".thinking-text")).to_have_text("".join(THOUGHT))
    content = answer.locator(".content")
    assert "Let me think" not in content.text_content()  # apart from the answer
    expect(content.locator("h1")).to_have_text("Answer")
    expect(content.locator("strong")).to_have_text("bold")
    code = content.locator("pre > code.language-python")
    expect(code).to_have_text('print("<script>")')
    assert content.locator("pre").get_attribute("data-language") == "python"
    expect(content.locator("table th")).to_have_text(["a", "b"])
    expect(content.locator("table td code")).to_have_text("x")
    links = content.locator("a")
    expect(links).to_have_count(1)  # the javascript: link stays text
    assert (links.get_attribute("href"), links.get_attribute("rel")) == ("https://example.com/", "noopener noreferrer")
    expect(content.locator("li")).to_have_count(3)
    assert "<script>window.pwned = 1</script>" in content.text_content()  # the model's HTML is text
    assert "[unsafe](javascript:alert(1))" in content.text_content()
    expect(answer.locator("script, img, b")).to_have_count(0)


def test_thinking_is_shown_apart_and_the_answer_is_rendered_markdown_kept_across_a_reload(page):
    sent = answer_cannedly(page, THOUGHT, ANSWER)
    page.goto(CANNED_ORIGIN + "/")
    expect(page.locator("#conversation-list li")).to_have_count(0)
    ask(page, "Show me some code.")
    wait_for_answer(assistant(page))
    check_rendered_answer(assistant(page))
    assert answer_text(assistant(page)) == "".join(ANSWER)
    assert page.evaluate("window.pwned") is None
    assistant(page).locator("details.thinking summary").click()  # opens on a click
    expect(assistant(page).locator(".thinking-text")).to_be_visible()
    expect(page.locator("#conversation-list li")).to_have_text(["Show me some code.×"])

    page.reload()
    expect(page.locator("#messages .message")).to_have_count(2)
    expect(page.locator('#messages .message[data-role="user"] .content')).to_have_text("Show me some code.")
    check_rendered_answer(assistant(page))
    assert page.evaluate("window.pwned") is None
    expect(page.locator('#conversation-list li[aria-current="true"]')).to_have_count(1)

    ask(page, "Thanks.")  # the conversation goes on: the answer is sent back, its thinking is not
    wait_for_answer(assistant(page, 1))
    assert sent[-1]["messages"] == [{"role": "user", "content": "Show me some code."},
                                    {"role": "assistant", "content": "".join(ANSWER)},
                                    {"role": "user", "content": "Thanks."}]


def test_conversations_are_started_switched_and_deleted(page):
    answer_cannedly(page, [], ["An answer without thinking."])
    page.goto(CANNED_ORIGIN + "/")
    ask(page, "First conversation")
    wait_for_answer(assistant(page))
    expect(assistant(page).locator("details.thinking")).to_be_hidden()
    page.click("#new-chat")
    expect(page.locator("#messages .message")).to_have_count(0)
    ask(page, "Second conversation")
    wait_for_answer(assistant(page))
    items = page.locator("#conversation-list li")
    expect(items.locator("button.open")).to_have_text(["Second conversation", "First conversation"])  # recent first

    items.nth(1).locator("button.open").click()
    expect(page.locator('#messages .message[data-role="user"] .content')).to_have_text("First conversation")
    expect(items.nth(1)).to_have_attribute("aria-current", "true")
    items.nth(0).locator("button.delete").click()  # another one: the one shown stays
    expect(items.locator("button.open")).to_have_text(["First conversation"])
    expect(page.locator('#messages .message[data-role="user"] .content')).to_have_text("First conversation")

    page.reload()
    expect(page.locator('#messages .message[data-role="user"] .content')).to_have_text("First conversation")
    items.nth(0).locator("button.delete").click()  # the one shown: the page starts a new one
    expect(page.locator("#conversation-list li")).to_have_count(0)
    expect(page.locator("#messages .message")).to_have_count(0)
    page.reload()
    expect(page.locator("#messages .message")).to_have_count(0)
    expect(page.locator("#conversation-list li")).to_have_count(0)


MARKDOWN_CASES = [  # (Markdown, the HTML markdown.js renders it into)
    ("a snake_case_name and 2 * 3 * 4", "<p>a snake_case_name and 2 * 3 * 4</p>"),
    ("*em* _em_ ~~gone~~ `a<b>`", "<p><em>em</em> <em>em</em> <del>gone</del> <code>a&lt;b&gt;</code></p>"),
    ("line one\nline two", "<p>line one<br>line two</p>"),
    ("```js\nlet x = 1;",  # a fence not closed yet (the answer is streaming)
     '<pre data-language="js"><code class="language-js" data-language="js">let x = 1;</code></pre>'),
    ("3. c\n4. d", '<ol start="3"><li>c</li><li>d</li></ol>'),
    ("- a\n  - b\n- c", "<ul><li><p>a</p><ul><li>b</li></ul></li><li>c</li></ul>"),
    ("> quoted *text*", "<blockquote><p>quoted <em>text</em></p></blockquote>"),
    ("## Title ##\n---", "<h2>Title</h2><hr>"),
    ("<https://example.com/x>", '<p><a href="https://example.com/x" target="_blank" rel="noopener noreferrer">'
                                "https://example.com/x</a></p>"),
    ('[x](javascript:alert(1)) <a href="javascript:1">y</a>',
     '<p>[x](javascript:alert(1)) &lt;a href="javascript:1"&gt;y&lt;/a&gt;</p>'),
]


def test_markdown_renderer_cases(page):
    answer_cannedly(page, [], [])
    page.goto(CANNED_ORIGIN + "/")
    html = page.evaluate("""(cases) => cases.map((text) => {
        const box = document.createElement('div');
        box.append(window.llamactxMarkdown.render(text));
        return box.innerHTML;
    })""", [text for text, _ in MARKDOWN_CASES])
    assert html == [expected for _, expected in MARKDOWN_CASES]
