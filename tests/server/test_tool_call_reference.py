"""Tool calls as llama-server makes them, through the `openai` client, streamed and not: SmolLM2 and Gemma 3 with
Functionary v3.2's template, tool_choice "required" (its grammar holds the reply to a call from the first token),
temperature 0, each answer from its whole prompt (cache_prompt false). Native llama-server 0c1e570's answers to
the same requests are in tests/data/tool_calls/[avx2/]tool_call_reference.json (make_tool_call_reference.py
there); the arguments' whitespace is the model's choice under the grammar, so it differs between the AVX-512 and
AVX2 builds' arithmetic and each variant has its own file.

- the non-streamed message: the same calls (names and arguments as written), content and finish reason;
- the stream: its pieces add up to the same calls; a call's first piece carries its id, type and name with its
  arguments so far, later pieces arguments only; and the pieces are llama-server's (a chunk may carry several
  of llama-server's when tokens arrive faster than they are sent).

Where llama-server itself is not `stable` (it writes other whitespace when the prompt's last token is decoded
alone: SmolLM2 hesitates between '"' and a second newline after "{\n" by 0.006 of a logit), what follows the
tie is the model's under another rounding (on the AVX2 build SmolLM2 then names the timezone "TOKITA" where the
AVX-512 build and llamactx on either write "UTC+08:00"): there the calls' names and argument keys are compared,
and the stream's pieces with this server's own answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.conftest import reference_path
from tests.server.conftest import running_server

REFERENCE = reference_path(Path(__file__).parents[1] / "data" / "tool_calls", "tool_call_reference.json")


def _reference() -> dict:
    if not REFERENCE.exists():
        pytest.fail(f"{REFERENCE} is missing: run tests/data/tool_calls/make_tool_call_reference.py")
    return json.loads(REFERENCE.read_text())


PAIRS = sorted((m, n) for n, m in _reference()["models"].items()) if REFERENCE.exists() else [("smollm2", "-")]


@pytest.fixture(scope="module")
def served(request, llamacpp_src):
    """(model, an openai client of a llamactx server of it with the reference's template); pytest orders the
    tests so that each model's server starts once."""
    model = request.param
    template = (llamacpp_src / _reference()["template"]).read_text()
    with running_server(model=model, alias=model, n_slots=1, n_ctx=2048, chat_template=template) as running:
        yield model, openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0)


def _request(case: dict) -> dict:
    body = dict(case["request"])
    extra = {"cache_prompt": body.pop("cache_prompt")}
    return {**body, "extra_body": extra}


def _streamed(client: openai.OpenAI, model: str, body: dict) -> tuple[list, str | None]:
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model=model, stream=True, **body):
        if not chunk.choices:
            continue
        assert not chunk.choices[0].delta.content
        pieces += chunk.choices[0].delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    return pieces, finish


def _coarsens(ours: list[str], theirs: list[str]) -> bool:
    """Whether `ours` is `theirs` with runs of neighbours joined."""
    i = 0
    for piece in ours:
        joined = ""
        while len(joined) < len(piece) and i < len(theirs):
            joined += theirs[i]
            i += 1
        if joined != piece:
            return False
    return i == len(theirs)


@pytest.mark.parametrize(("served", "name"), PAIRS, indirect=["served"])
def test_calls_are_llama_servers(served, name):
    model, client = served
    case = _reference()["cases"][name]
    choice = client.chat.completions.create(model=model, **_request(case)).choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
    assert _comparable(calls, case) == _comparable(case["message"]["tool_calls"], case) and calls
    assert (choice.message.content or "", choice.finish_reason) == (case["message"]["content"] or "",
                                                                    case["finish_reason"])
    assert all(c.id and c.type == "function" for c in choice.message.tool_calls)


@pytest.mark.parametrize(("served", "name"), PAIRS, indirect=["served"])
def test_streamed_calls_are_llama_servers(served, name):
    model, client = served
    case = _reference()["cases"][name]
    pieces, finish = _streamed(client, model, _request(case))
    theirs = [p for chunk in case["stream"]["chunks"] for p in chunk["tool_calls"]]
    assert finish == case["stream"]["finish_reason"] == "tool_calls"
    if not case["stable"]:  # the pieces of this server's own answer (test_calls_are_llama_servers checks it)
        whole = client.chat.completions.create(model=model, **_request(case)).choices[0].message.tool_calls
        assert _comparable([{"name": c.function.name, "arguments": c.function.arguments} for c in whole],
                           case) == _comparable(case["stream"]["tool_calls"], case)
    for index, call in enumerate(case["stream"]["tool_calls"]):
        mine = [p for p in pieces if p.index == index]
        first, rest = mine[0], mine[1:]
        assert (bool(first.id), first.type, first.function.name) == (True, "function", call["name"])
        assert first.function.arguments.startswith("{") and all(
            p.id is None and p.function.name is None for p in rest)
        args = [p.function.arguments for p in mine]
        if case["stable"]:
            assert "".join(args) == call["arguments"]
            assert _coarsens(args, [p["arguments"] for p in theirs if p["index"] == index]), args
        else:
            assert "".join(args) == whole[index].function.arguments
    assert len({p.index for p in pieces}) == len(case["stream"]["tool_calls"])


def _comparable(calls: list[dict], case: dict) -> list:
    """The calls as written where llama-server's are stable, else their names and argument keys."""
    if case["stable"]:
        return calls
    return [(c["name"], sorted(json.loads(c["arguments"]))) for c in calls]
