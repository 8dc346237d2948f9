"""Record native llama-server's (llama.cpp 0c1e570) answers for tests/server/test_reasoning_budget.py: SmolLM2-135M
Q4_1 with Qwen 3.5's template (its generation prompt opens <think>), --jinja --reasoning-budget 8, temperature 0,
reasoning_format none and auto. Writes llama_server.json beside this file; the tests read only that. Run by hand:

    .venv/bin/python tests/data/reasoning_budget/make_reasoning_budget_reference.py [path/to/llama-server]
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
TEMPLATE = "models/templates/Qwen3.5-4B.jinja"
BUDGET = 8
BODY = {"messages": [{"role": "user", "content": "Write a long poem about the sea."}], "temperature": 0,
        "max_tokens": 30}


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from llamactx.embedded import smollm2_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.argv[1] if len(sys.argv) > 1 else SERVER, "-m", str(smollm2_path()), "--jinja",
           "--chat-template-file", str(SRC / TEMPLATE), "-c", "2048", "-np", "1", "-t", "1", "--host", "127.0.0.1",
           "--port", str(port), "--no-webui", "--reasoning-budget", str(BUDGET)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {"template": TEMPLATE, "reasoning_budget": BUDGET, "request": BODY, "responses": {}}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Connection": "close"}) as c:
            for _ in range(600):
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            for fmt in ("none", "auto"):
                res = c.post("/v1/chat/completions", json={**BODY, "reasoning_format": fmt}).json()
                out["responses"][fmt] = {"message": res["choices"][0]["message"],
                                         "finish_reason": res["choices"][0]["finish_reason"],
                                         "completion_tokens": res["usage"]["completion_tokens"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    (HERE / "llama_server.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
