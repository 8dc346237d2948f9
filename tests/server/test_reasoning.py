"""Thinking and tool calls as llama-server returns them, through the `openai` client: the embedded SmolLM2 is
steered by a grammar into a `<think>...</think>` reply, and the streamed deltas add up to the non-streamed
message (reasoning_content apart from content); a request's unknown reasoning_format is a 400 naming the known
ones; reasoning_format "none" leaves the thinking in the content."""

from __future__ import annotations

import openai
import pytest

THOUGHT, ANSWER = "I should greet", "Hello there."
GRAMMAR = f'root ::= "<think>{THOUGHT}</think>{ANSWER}"'
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _ask(client, stream: bool, **extra):
    kw = dict(model="smollm2", messages=MESSAGES, temperature=0, max_tokens=48, extra_body={"grammar": GRAMMAR,
                                                                                             **extra})
    if not stream:
        msg = client.chat.completions.create(**kw).choices[0].message
        return msg.content, (msg.model_extra or {}).get("reasoning_content")
    content, reasoning = "", ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    return content, reasoning or None


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_comes_back_as_reasoning_content(client, stream):
    assert _ask(client, stream) == (ANSWER, THOUGHT)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_none_keeps_thinking_in_the_content(client, stream):
    assert _ask(client, stream, reasoning_format="none") == (f"<think>{THOUGHT}</think>{ANSWER}", None)


def test_unknown_reasoning_format_is_a_400_naming_the_known_ones(client):
    with pytest.raises(openai.BadRequestError, match="deepseek-legacy"):
        _ask(client, False, reasoning_format="r1")


def test_enable_thinking_must_be_a_boolean(client):
    with pytest.raises(openai.BadRequestError, match="enable_thinking"):
        _ask(client, False, chat_template_kwargs={"enable_thinking": "yes"})
