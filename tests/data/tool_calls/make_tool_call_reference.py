"""Record native llama-server's (llama.cpp 0c1e570) tool calls for tests/server/test_tool_call_reference.py: the
embedded SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M with Functionary v3.2's template (--jinja
--chat-template-file), whose grammar (common/parsers/functionary-v3-2.cpp) makes "required" a call from the first
token: temperature 0, seed 1. For each case: the non-streamed message and finish reason, the streamed chunks'
deltas (the tool-call pieces without their random ids, the content pieces) with what they add up to, and whether
the calls are `stable`: the same when the prompt's last token is decoded alone (a near tie, most often in the
arguments' whitespace, makes them differ: then only their JSON values are llama.cpp's whatever the rounding).

Written to tool_call_reference.json beside this file (the AVX-512 build's libraries) and to avx2/ (the same
llama-server binary on the AVX2 build's libllama / libggml, put first by LD_LIBRARY_PATH: the binaries' RUNPATH
yields to it). The tests read only those files. Run by hand:

    .venv/bin/python tests/data/tool_calls/make_tool_call_reference.py [path/to/llama-server]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent
BIN = Path(os.path.expanduser("~/.cache/llamactx-llamacpp"))
SERVER = BIN / "bin" / "llama-server"
LIBS = {".": None, "avx2": BIN / "avx2" / "bin"}  # variant folder -> LD_LIBRARY_PATH (None: the binary's own)
SRC = Path(os.environ.get("LLAMACPP_SRC", "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))
TEMPLATE = "models/templates/meetkai-functionary-medium-v3.2.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
BASE = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0, "seed": 1,
        "max_tokens": 48, "tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False,
        "cache_prompt": False}  # each answer from its whole prompt: a reused one decodes its last token alone
# case name -> (model, request fields over BASE)
CASES = {
    "smollm2_required": ("smollm2", {}),
    "smollm2_required_parallel": ("smollm2", {"parallel_tool_calls": True}),
    "smollm2_time": ("smollm2", {"messages": [{"role": "user", "content": "What time is it in Tokyo?"}]}),
    "gemma3_required": ("gemma3", {}),
}


def streamed(client: httpx.Client, body: dict) -> dict:
    """The chunks' deltas: per chunk, its content piece and its tool-call pieces (index, whether it has an id,
    type, name, arguments piece); and what they add up to."""
    chunks, content, calls, finish = [], "", {}, None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as res:
        for line in res.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[len("data: "):])
            if not obj.get("choices"):
                continue
            choice = obj["choices"][0]
            delta = choice.get("delta", {})
            pieces = [{"index": tc["index"], "has_id": bool(tc.get("id")), "type": tc.get("type"),
                       "name": tc.get("function", {}).get("name"),
                       "arguments": tc.get("function", {}).get("arguments")} for tc in delta.get("tool_calls", [])]
            if delta.get("content") or pieces:
                chunks.append({"content": delta.get("content"), "tool_calls": pieces})
            content += delta.get("content") or ""
            for p in pieces:
                name, args = calls.get(p["index"], ("", ""))
                calls[p["index"]] = (p["name"] or name, args + (p["arguments"] or ""))
            finish = choice.get("finish_reason") or finish
    return {"chunks": chunks, "content": content or None, "finish_reason": finish,
            "tool_calls": [{"name": n, "arguments": a} for n, a in (calls[i] for i in sorted(calls))]}


def stable(client: httpx.Client, body: dict, calls: list) -> bool:
    """Whether llama-server writes the same calls when the prompt's last token is decoded alone (the second of two
    requests with cache_prompt reuses the rest): False where the model's choice (most often the arguments'
    whitespace) is a near tie that rounding decides."""
    for _ in range(2):
        res = client.post("/v1/chat/completions", json={**body, "cache_prompt": True}).json()
    again = [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
             for t in res["choices"][0]["message"].get("tool_calls", [])]
    return again == calls


def record(server: str, model_path: str, libs: Path | None, cases: dict) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **({"LD_LIBRARY_PATH": str(libs)} if libs else {})}
    cmd = [server, "-m", model_path, "--jinja", "--chat-template-file", str(SRC / TEMPLATE), "-c", "2048",
           "-np", "1", "-t", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    out = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Connection": "close"}) as c:
            for _ in range(600):
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            for name, (_, fields) in cases.items():
                body = {**BASE, **fields}
                res = c.post("/v1/chat/completions", json=body).json()
                if "choices" not in res:
                    raise RuntimeError(f"{name}: {res}")
                msg = res["choices"][0]["message"]
                calls = [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                         for t in msg.get("tool_calls", [])]
                out[name] = {"request": body, "message": {"content": msg.get("content"), "tool_calls": calls},
                             "finish_reason": res["choices"][0]["finish_reason"],
                             "completion_tokens": res["usage"]["completion_tokens"], "stream": streamed(c, body),
                             "stable": stable(c, body, calls)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from llamactx.embedded import gemma3_path, smollm2_path

    server = sys.argv[1] if len(sys.argv) > 1 else str(SERVER)
    paths = {"smollm2": str(smollm2_path()), "gemma3": str(gemma3_path())}
    for folder, libs in LIBS.items():
        cases = {}
        for model, path in paths.items():
            cases.update(record(server, path, libs, {k: v for k, v in CASES.items() if v[0] == model}))
        out = {"template": TEMPLATE, "models": {k: v[0] for k, v in CASES.items()}, "cases": cases}
        (HERE / folder).mkdir(exist_ok=True)
        (HERE / folder / "tool_call_reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
