"""--reasoning-budget N against native llama-server with the same flags (tests/data/reasoning_budget/llama_server.json,
recorded by make_reasoning_budget_reference.py there): SmolLM2 with Qwen 3.5's template, whose generation prompt
opens <think>; after 8 thinking tokens (the template's own "\\n" is the first) the end tag, "\\n</think>" for this
family, is forced token by token and the model goes on to answer. Temperature 0, so the text is llama-server's
token for token; with reasoning_format auto the thinking comes back apart."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.server.conftest import running_server

REFERENCE = Path(__file__).parents[1] / "data" / "reasoning_budget" / "llama_server.json"


@pytest.fixture(scope="module")
def reference():
    if not REFERENCE.exists():
        pytest.fail(f"{REFERENCE} is missing: run tests/data/reasoning_budget/make_reasoning_budget_reference.py")
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def client(llamacpp_src, reference):
    template = (llamacpp_src / reference["template"]).read_text()
    with running_server(model="smollm2", alias="smollm2", n_slots=1, n_ctx=2048, chat_template=template,
                        reasoning_budget=reference["reasoning_budget"]) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0)


def _ask(client, body: dict, fmt: str, stream: bool) -> tuple[str, str, str]:
    kw = dict(model="smollm2", messages=body["messages"], temperature=body["temperature"],
              max_tokens=body["max_tokens"], extra_body={"reasoning_format": fmt})
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        msg = choice.message
        return msg.content or "", (msg.model_extra or {}).get("reasoning_content") or "", choice.finish_reason
    content, reasoning, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            finish = chunk.choices[0].finish_reason or finish
    return content, reasoning, finish


@pytest.mark.parametrize("stream", [False, True])
def test_the_forced_end_of_thinking_is_llama_servers(client, reference, stream):
    native = reference["responses"]["none"]
    content, reasoning, finish = _ask(client, reference["request"], "none", stream)
    assert (content, reasoning, finish) == (native["message"]["content"], "", native["finish_reason"])
    assert "\n</think>" in content


@pytest.mark.parametrize("stream", [False, True])
def test_the_thinking_comes_back_apart(client, reference, stream):
    native = reference["responses"]["auto"]
    content, reasoning, finish = _ask(client, reference["request"], "auto", stream)
    # llama.cpp's Qwen 3.5 parser keeps the newline before "</think>" in the reasoning; ours strips it
    assert (content, reasoning, finish) == (native["message"]["content"],
                                            native["message"]["reasoning_content"].strip(), native["finish_reason"])


def _thinking(client, reference, **extra) -> str:
    body = reference["request"]
    out = client.chat.completions.create(model="smollm2", messages=body["messages"], temperature=0,
                                         max_tokens=body["max_tokens"], extra_body={"reasoning_format": "none",
                                                                                    **extra})
    text = out.choices[0].message.content
    assert text.startswith("<think>") and "\n</think>" in text
    return text[:text.index("\n</think>")]


def test_a_request_sets_its_own_budget(client, reference):
    """reasoning_budget_tokens (or thinking_budget_tokens) instead of --reasoning-budget; -1 keeps the server's;
    the message goes before the forced end tag."""
    native = reference["responses"]["none"]["message"]["content"]
    native_thinking = native[:native.index("\n</think>")]
    short = _thinking(client, reference, reasoning_budget_tokens=4)
    assert len(short) < len(native_thinking) and native_thinking.startswith(short)
    assert _thinking(client, reference, thinking_budget_tokens=4) == short
    assert _thinking(client, reference, reasoning_budget_tokens=-1) == native_thinking
    with_message = _thinking(client, reference, reasoning_budget_tokens=4, reasoning_budget_message=" Done.")
    assert with_message == short + " Done."
    with pytest.raises(openai.BadRequestError, match="reasoning_budget_tokens"):
        _thinking(client, reference, reasoning_budget_tokens=-2)


def test_an_anthropic_thinking_budget(client, reference):
    """/v1/messages' thinking {"type": "enabled", "budget_tokens": N} is the chat's thinking_budget_tokens
    (llama-server's server-chat.cpp)."""
    short = _thinking(client, reference, reasoning_budget_tokens=4).removeprefix("<think>").strip()
    body = {"model": "smollm2", "max_tokens": reference["request"]["max_tokens"], "temperature": 0,
            "messages": reference["request"]["messages"], "thinking": {"type": "enabled", "budget_tokens": 4}}
    out = client.post("/messages", cast_to=object, body=body)
    assert out["content"][0] == {"type": "thinking", "thinking": short, "signature": ""}
