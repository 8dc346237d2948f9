"""Record native llama-server's (llama.cpp 0c1e570) answer to tests/server/test_tool_choice.py's tool_choice "none"
request: SmolLM2-135M Q4_1 with Qwen 2.5's template, --jinja, temperature 0. (Its "required" is not recorded: with
these templates llama-server 0c1e570 derives no tool-call grammar for this model and answers in prose; a named
function as tool_choice it does not read at all.) Writes llama_server_none.json beside this file. Run by hand:

    .venv/bin/python tests/data/tool_calls/make_tool_choice_reference.py [path/to/llama-server]
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
SERVER = os.path.expanduser("~/.cache/llamactx-llamacpp/bin/llama-server")
SRC = Path(os.environ.get("LLAMACPP_SRC", "/work/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"))


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from llamactx.embedded import smollm2_path
    from tests.server.test_tool_choice import BASE, TEMPLATE_PATH

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.argv[1] if len(sys.argv) > 1 else SERVER, "-m", str(smollm2_path()), "--jinja",
           "--chat-template-file", str(SRC / TEMPLATE_PATH), "-c", "4096", "-np", "1", "-t", "1",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = {**BASE, "tool_choice": "none", "max_tokens": 16}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Connection": "close"}) as c:
            for _ in range(600):
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            res = c.post("/v1/chat/completions", json=body).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = {"template": TEMPLATE_PATH, "request": body, "message": res["choices"][0]["message"],
           "finish_reason": res["choices"][0]["finish_reason"], "usage": res["usage"]}
    (HERE / "llama_server_none.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
