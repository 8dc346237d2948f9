"""`Llama.create_chat_completion` parses a reply as llama-server does (llamactx.chat_request): thinking comes back
as `reasoning_content` (streamed as deltas that add up to the whole message), tool calls as `tool_calls`, and
tool_choice constrains calls with the server's grammar: lazy for "auto" (free words until `<tool_call>`, then
the tool's schema), none for "none". An explicit chat_format keeps llama-cpp-python's text as written. The
embedded SmolLM2 is steered by a grammar, or by a logits processor, into the replies checked."""

from __future__ import annotations

import json

import jsonschema
import llama_cpp
import openai.types.chat as oai_chat
import pytest

THOUGHT, ANSWER = "I should greet", "Hello there."
THINK_GRAMMAR = f'root ::= "<think>{THOUGHT}</think>{ANSWER}"'
HELLO = [{"role": "user", "content": "Say hello."}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                              "parameters": PARAMS}}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
CALL_GRAMMAR = f"root ::= {json.dumps(CALL)}"


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama("smollm2", n_ctx=512, verbose=False)


def streamed(chunks) -> dict:
    """The message a stream's deltas add up to, as an OpenAI client accumulates them (calls by index)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        oai_chat.ChatCompletionChunk.model_validate(chunk)
        choice = chunk["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            slot["name"] += (call.get("function") or {}).get("name") or ""
            slot["arguments"] += (call.get("function") or {}).get("arguments") or ""
        finish = choice.get("finish_reason") or finish
    return {"content": content or None, "reasoning_content": reasoning or None,
            "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


def test_thinking_comes_back_as_reasoning_content_whole_and_streamed(llm):
    out = llm.create_chat_completion(HELLO, grammar=THINK_GRAMMAR, temperature=0, max_tokens=40)
    oai_chat.ChatCompletion.model_validate(out)
    message = out["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == (ANSWER, THOUGHT)
    chunks = list(llm.create_chat_completion(HELLO, grammar=THINK_GRAMMAR, temperature=0, max_tokens=40,
                                             stream=True))
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("reasoning_content")) >= 2  # token by token
    got = streamed(chunks)
    assert (got["content"], got["reasoning_content"], got["finish_reason"]) == (ANSWER, THOUGHT, "stop")


def test_reasoning_format_none_and_an_explicit_chat_format_keep_the_text_as_written(llm):
    written = f"<think>{THOUGHT}</think>{ANSWER}"
    out = llm.create_chat_completion(HELLO, grammar=THINK_GRAMMAR, temperature=0, max_tokens=40,
                                     reasoning_format="none")
    assert out["choices"][0]["message"]["content"] == written
    assert "reasoning_content" not in out["choices"][0]["message"]
    chatml = llama_cpp.Llama("smollm2", n_ctx=256, chat_format="chatml", verbose=False)
    out = chatml.create_chat_completion(HELLO, grammar=THINK_GRAMMAR, temperature=0, max_tokens=40)
    assert out["choices"][0]["message"]["content"] == written  # llama-cpp-python's chat_format: no parsing
    out = chatml.create_chat_completion(HELLO, grammar=THINK_GRAMMAR, temperature=0, max_tokens=40,
                                        reasoning_format="deepseek")
    assert out["choices"][0]["message"]["reasoning_content"] == THOUGHT
    with pytest.raises(ValueError, match="deepseek-legacy"):
        llm.create_chat_completion(HELLO, max_tokens=4, reasoning_format="r1")


def test_a_call_is_returned_as_tool_calls_whole_and_streamed(llm):
    out = llm.create_chat_completion(ASK_WEATHER, tools=WEATHER, grammar=CALL_GRAMMAR, temperature=0,
                                     max_tokens=48)
    oai_chat.ChatCompletion.model_validate(out)
    choice = out["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    got = streamed(llm.create_chat_completion(ASK_WEATHER, tools=WEATHER, grammar=CALL_GRAMMAR, temperature=0,
                                              max_tokens=48, stream=True))
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == [("get_weather", {"city": "Paris"})]
    assert got["finish_reason"] == "tool_calls" and not got["content"]


class ForceThenBoost:
    """A logits processor that forces the reply to begin with `forced` tokens, then pushes `boosted` hard for
    the next `n_boosted`: a model left alone writes it after the trigger, only a grammar can keep it out."""

    def __init__(self, forced: list[int], boosted: int, n_boosted: int = 3):
        self.forced, self.boosted, self.n_boosted, self.n_prompt = forced, boosted, n_boosted, None

    def __call__(self, input_ids, scores):
        self.n_prompt = len(input_ids) if self.n_prompt is None else self.n_prompt
        k = len(input_ids) - self.n_prompt
        if k < len(self.forced):
            scores[self.forced[k]] += 1000.0
        elif k < len(self.forced) + self.n_boosted:
            scores[self.boosted] += 1000.0
        return scores


def test_tool_choice_auto_constrains_a_call_from_its_trigger_on_and_none_does_not(llm):
    forced = llm.tokenize(b"<tool_call>", add_bos=False, special=True)
    (boosted,) = llm.tokenize(b" Hello", add_bos=False)
    kw = dict(tools=WEATHER, temperature=0, max_tokens=40)

    out = llm.create_chat_completion(ASK_WEATHER, tool_choice="auto", **kw,
                                     logits_processor=[ForceThenBoost(forced, boosted)])
    (call,) = out["choices"][0]["message"]["tool_calls"]  # the lazy grammar kept " Hello" out of the call
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS)

    out = llm.create_chat_completion(ASK_WEATHER, tool_choice="none", **kw,
                                     logits_processor=[ForceThenBoost(forced, boosted)])
    message = out["choices"][0]["message"]
    assert message["content"].startswith("<tool_call> Hello Hello Hello") and not message.get("tool_calls")


def test_tool_choice_required_and_named_always_call(llm):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = llm.create_chat_completion(ASK_WEATHER, tools=WEATHER, tool_choice=choice, temperature=0,
                                         max_tokens=48)
        (call,) = out["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and out["choices"][0]["finish_reason"] == "tool_calls"
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS)
    with pytest.raises(ValueError, match="tool_choice"):
        llm.create_chat_completion(ASK_WEATHER, tools=WEATHER, tool_choice="required", grammar=CALL_GRAMMAR)
    with pytest.raises(ValueError, match="tool_choice.function.name"):
        llm.create_chat_completion(ASK_WEATHER, tools=WEATHER, tool_choice={"type": "function",
                                                                             "function": {"name": "nope"}})
