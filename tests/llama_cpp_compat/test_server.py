"""`python -m llama_cpp.server`: llama-cpp-python's server settings and command line on llamactx's server. The
settings map onto ServerConfig with Llama's meaning; unknown-here settings are refused by name; the app answers
llama-cpp-python's routes with what `Llama` gives for the same request."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
import uvicorn
from llama_cpp.server.__main__ import main, parser
from llama_cpp.server.app import create_app, server_config
from llama_cpp.server.settings import Settings

from llamactx.server.http import uvicorn_config
from tests.server.conftest import free_port


def test_command_line_settings_map_to_the_server_config():
    args = parser().parse_args(["--model", "smollm2", "--n_ctx", "1024", "--flash_attn", "true", "--model_alias",
                                "m", "--api_key", "k", "--cache", "true", "--cache_size", str(64 << 20)])
    settings = Settings.model_validate({k: v for k, v in vars(args).items() if v is not None and k != "config_file"})
    config = server_config(settings)
    rt = config.runtime
    assert (rt.n_ctx, rt.flash_attn, rt.n_batch, rt.n_slots, rt.swa_full) == (1024, True, 512, 4, True)
    assert (config.alias, config.api_keys, config.cache_ram) == ("m", ["k"], 64.0)
    default = server_config(Settings(model="smollm2"))
    assert (default.runtime.n_ctx, default.runtime.flash_attn, default.alias) == (2048, False, "smollm2")


@pytest.mark.parametrize(("flag", "value", "name"), [("--clip_model_path", "x.gguf", "clip_model_path"),
                                                     ("--use_mlock", "true", "use_mlock"),
                                                     ("--cache_type", "disk", "cache_type"),
                                                     ("--draft_model", "other.gguf", "draft_model")])
def test_refused_settings_name_themselves(flag, value, name, capsys):
    assert main(["--model", "smollm2", flag, value, "--cache", "true"]) == 2
    assert name in capsys.readouterr().err


def test_app_answers_like_llama():
    app = create_app(Settings(model="smollm2", n_ctx=512, n_parallel=2, model_alias="smol"))
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, 30.0, 16, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.2)
        body = {"prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 6,
                "temperature": 0.0}
        out = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
        assert out["choices"][0]["text"] == " is a classic example of a"  # Llama.create_completion's (SmolLM2)
        assert out["model"] == "smol"
        models = httpx.get(url + "/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["smol"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_compute_threads_wait_asleep_unless_told(monkeypatch):
    """OpenMP threads that spin between steps take the cores the server's own threads need (bench/
    llama_cpp_server_speed.py: 4.1 tokens/s spinning, 143 asleep, at 4 clients on 2 loaded cores)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main(["--model", "smollm2", "--use_mlock", "true"]) == 2
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert main(["--model", "smollm2", "--use_mlock", "true"]) == 2
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
