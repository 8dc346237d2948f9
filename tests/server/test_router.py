"""Router mode (llama-server's --models-dir / --models-max, server/model_router.py and router_app.py): a directory of
symlinks to the embedded SmolLM2 and Gemma 3, a tiny llama written here, a second name for SmolLM2's file and a
truncated GGUF, served by one router in this process (uvicorn on 127.0.0.1 and a free port, stopped by the fixture)
with --models-max 2. Also the chat page's model list against it, in Debian's chromium."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from llamactx.cli.args import CommandError
from llamactx.cli.serve import parse_router_flags
from llamactx.embedded import gemma3_path, smollm2_path
from llamactx.server.http import uvicorn_config
from llamactx.server.router_app import create_router_app
from tests.gguf.tiny_model import write_tiny_llama
from tests.server.conftest import free_port

START_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 300  # a model's load with its warm-up (kernels compiled by earlier tests: seconds)
THREE = ("tiny", "smollm2", "gemma3")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    (d / "smollm2.gguf").symlink_to(smollm2_path())
    (d / "gemma3.gguf").symlink_to(gemma3_path())
    (d / "smol-again.gguf").symlink_to(smollm2_path())  # two names, one file
    write_tiny_llama(d / "tiny.gguf")
    whole = smollm2_path().read_bytes()
    (d / "broken.gguf").write_bytes(whole[: len(whole) // 3])  # a truncated GGUF
    (d / "mmproj-ignored.gguf").write_bytes(b"GGUF")  # a companion file: not a model
    return d


class Router:
    def __init__(self, url: str, app):
        self.url, self.app = url, app

    @property
    def router(self):
        return self.app.state.router

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=LOAD_TIMEOUT_S)

    def statuses(self) -> dict[str, dict]:
        return {m["id"]: m["status"] for m in httpx.get(self.url + "/models", timeout=10).json()["data"]}

    def wait_status(self, name: str, value: str) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while self.statuses()[name]["value"] != value:
            assert time.monotonic() < deadline, f"{name} never became {value}: {self.statuses()[name]}"
            time.sleep(0.05)

    def unload_all(self) -> None:
        for name, status in self.statuses().items():
            if status["value"] == "loaded":
                assert httpx.post(self.url + "/models/unload", json={"model": name}).json() == {"success": True}
                self.wait_status(name, "unloaded")


@pytest.fixture(scope="module")
def served(models_dir) -> Iterator[Router]:
    flags = parse_router_flags(["--models-dir", str(models_dir), "--models-max", "2", "-c", "512", "-np", "2",
                                "--temp", "0"])
    config = flags[0]
    app = create_router_app(*flags)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, config.read_timeout, config.max_connections, host="127.0.0.1",
                                           port=port))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "the router did not start"
            time.sleep(0.05)
        yield Router(url, app)
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def chat(client: httpx.Client, model: str, n: int = 4, **extra) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": model, "max_tokens": n, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "Hello"}], **extra})


def test_the_directory_is_listed_by_name_with_statuses_and_the_router_props(served):
    body = httpx.get(served.url + "/v1/models").json()
    ids = [m["id"] for m in body["data"]]
    assert sorted(ids) == ["broken", "gemma3", "smol-again", "smollm2", "tiny"]  # no mmproj companion
    assert {m["status"]["value"] for m in body["data"]} == {"unloaded"}
    props = httpx.get(served.url + "/props").json()
    assert (props["role"], props["max_instances"], props["models_autoload"]) == ("router", 2, True)


def test_requests_load_models_on_demand_and_models_max_unloads_the_least_recently_used(served):
    served.unload_all()
    with served.client() as c:
        for name in THREE[:2]:
            r = chat(c, name)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == name
        st = served.statuses()
        assert (st["tiny"]["value"], st["smollm2"]["value"], st["gemma3"]["value"]) == ("loaded", "loaded",
                                                                                        "unloaded")
        assert chat(c, "tiny").status_code == 200  # tiny is now the most recently used: smollm2 goes, not tiny
        assert chat(c, "gemma3").status_code == 200
        st = served.statuses()
        assert (st["tiny"]["value"], st["smollm2"]["value"], st["gemma3"]["value"]) == ("loaded", "unloaded",
                                                                                        "loaded")
    assert sum(e.resident for e in served.router.entries.values()) == 2


def test_concurrent_requests_to_two_models_are_served_at_once(served):
    with served.client() as c:  # both loaded first: the overlap below is generation, not loading
        assert chat(c, "smollm2").status_code == 200 and chat(c, "gemma3").status_code == 200
    times: dict[str, list[float]] = {}

    def stream(model: str) -> None:
        with httpx.Client(base_url=served.url, timeout=LOAD_TIMEOUT_S) as c, c.stream(
                "POST", "/v1/chat/completions",
                json={"model": model, "max_tokens": 32, "ignore_eos": True, "stream": True, "temperature": 0,
                      "messages": [{"role": "user", "content": "Count to fifty."}]}) as r:
            assert r.status_code == 200
            times[model] = [time.monotonic() for line in r.iter_lines() if line.startswith("data: {")]

    threads = [threading.Thread(target=stream, args=(m,)) for m in ("smollm2", "gemma3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=LOAD_TIMEOUT_S)
    a, b = times["smollm2"], times["gemma3"]
    assert len(a) >= 32 and len(b) >= 32
    assert a[0] < b[-1] and b[0] < a[-1], "one model's answer waited for the other's"


def test_two_names_for_one_file_map_it_once(served):
    with served.client() as c:
        assert chat(c, "smollm2").status_code == 200
        assert chat(c, "smol-again").status_code == 200
    entries = served.router.entries
    a, b = entries["smollm2"].state, entries["smol-again"].state
    assert a.model is b.model  # one Model, one read-only mapping
    assert a.engine is not b.engine  # each name its own slots, caches and engine


def test_a_model_that_fails_to_load_names_its_file_and_the_others_keep_serving(served, models_dir):
    with served.client() as c:
        r = chat(c, "broken")
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert "broken" in message and str(models_dir / "broken.gguf") in message
        status = served.statuses()["broken"]
        assert status["value"] == "unloaded" and status["failed"] is True
        assert chat(c, "tiny").status_code == 200
        assert chat(c, "broken").status_code == 503  # tried again, refused again
        assert chat(c, "tiny").status_code == 200


def test_load_and_unload_routes_and_their_refusals(served):
    url = served.url
    if served.statuses()["tiny"]["value"] == "loaded":
        httpx.post(url + "/models/unload", json={"model": "tiny"})
        served.wait_status("tiny", "unloaded")
    assert httpx.post(url + "/models/load", json={"model": "tiny"}).json() == {"success": True}
    served.wait_status("tiny", "loaded")
    again = httpx.post(url + "/models/load", json={"model": "tiny"})
    assert again.status_code == 400 and "already running" in again.json()["error"]["message"]
    assert httpx.post(url + "/models/load", json={"model": "nope"}).status_code == 404
    assert httpx.post(url + "/models/unload", json={"model": "tiny"}).json() == {"success": True}
    served.wait_status("tiny", "unloaded")
    r = httpx.post(url + "/models/unload", json={"model": "tiny"})
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]
    with served.client() as c:
        missing = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert missing.status_code == 400 and "model name is missing" in missing.json()["error"]["message"]
        unknown = chat(c, "no-such-model")
        assert unknown.status_code == 400 and "'no-such-model' not found" in unknown.json()["error"]["message"]
        assert c.get("/props", params={"model": "tiny"}).json()["model_alias"] == "tiny"


def test_ollama_lists_the_routers_models_and_routes_chat_by_name(served):
    tags = httpx.get(served.url + "/api/tags").json()
    assert {"tiny:latest", "smollm2:latest", "gemma3:latest"} <= {m["name"] for m in tags["models"]}
    r = httpx.post(served.url + "/api/chat", timeout=LOAD_TIMEOUT_S,
                   json={"model": "tiny:latest", "stream": False, "options": {"num_predict": 4},
                         "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny:latest" and r.json()["done"] is True
    assert served.statuses()["tiny"]["value"] == "loaded"
    assert "tiny:latest" in [m["name"] for m in httpx.get(served.url + "/api/ps").json()["models"]]
    missing = httpx.post(served.url + "/api/chat", json={"model": "nope", "messages": []})
    assert missing.status_code == 404 and missing.json() == {"error": "model 'nope' not found"}


def test_models_reload_reads_the_directory_again(served, models_dir):
    extra = models_dir / "late.gguf"
    extra.symlink_to(models_dir / "tiny.gguf")
    try:
        assert "late" not in served.statuses()
        ids = [m["id"] for m in httpx.get(served.url + "/models", params={"reload": 1}).json()["data"]]
        assert "late" in ids and "tiny" in ids
    finally:
        extra.unlink()
    ids = [m["id"] for m in httpx.get(served.url + "/models", params={"reload": 1}).json()["data"]]
    assert "late" not in ids and "tiny" in ids


def test_presets_name_files_and_set_flags_with_the_command_line_first(tmp_path, models_dir):
    ini = tmp_path / "presets.ini"
    ini.write_text("version = 1\n[*]\nc = 1024\nnp = 3\n\n[small]\nmodel = " + str(models_dir / "tiny.gguf")
                   + "\nc = 768\nload-on-startup = true\n\n[tiny]\nctx-size = 2048\n", encoding="utf-8")
    config, specs, models_max, autoload, _ = parse_router_flags(
        ["--models-dir", str(models_dir), "--models-preset", str(ini), "-np", "2", "--no-models-autoload"])
    by_name = {s.name: s for s in specs}
    assert by_name["small"].path == models_dir / "tiny.gguf" and by_name["small"].load_on_startup
    assert by_name["small"].config.runtime.n_ctx == 768 and by_name["tiny"].config.runtime.n_ctx == 2048
    assert by_name["gemma3"].config.runtime.n_ctx == 1024  # [*]
    assert {s.config.runtime.n_slots for s in specs} == {2}  # -np on the command line wins over [*]
    assert (models_max, autoload) == (4, False)
    with pytest.raises(CommandError, match="exclude each other"):
        parse_router_flags(["-m", "smollm2", "--models-dir", str(models_dir)])
    bad = tmp_path / "bad.ini"
    bad.write_text("[x]\nmodel = /dev/null\nno-such-flag = 1\n", encoding="utf-8")
    with pytest.raises(CommandError, match=r"\[x\] no-such-flag"):
        parse_router_flags(["--models-preset", str(bad)])


def test_the_chat_page_lists_the_models_and_sends_the_chosen_one(served):
    from playwright.sync_api import expect, sync_playwright

    from tests.server.test_webui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the web page tests need Debian's chromium; they do not skip")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.goto(served.url + "/")
            select = page.locator("#model-select")
            expect(select.locator("option")).to_have_count(5)
            first = page.locator("#model-name").inner_text()
            select.select_option("tiny")
            expect(page.locator("#model-name")).to_have_text("tiny")
            with page.expect_request("**/v1/chat/completions") as sent:
                page.fill("#input", "Hi")
                page.press("#input", "Enter")
            assert json.loads(sent.value.post_data)["model"] == "tiny"
            assert first in ("broken", "gemma3", "smol-again", "smollm2", "tiny")
        finally:
            browser.close()
