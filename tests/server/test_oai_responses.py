"""OpenAI's Responses API (/v1/responses) through the official `openai` client: the same chat underneath, as a
`response` object or the Responses stream."""

from __future__ import annotations

import httpx
import openai

INPUT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]


def test_responses_whole_and_streamed_are_the_chat_answer(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    res = client.responses.create(model="smollm2", input=INPUT, max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(model="smollm2", messages=INPUT, max_tokens=8, temperature=0)
    assert res.id.startswith("resp") and res.output[0].id.startswith("msg") and res.status == "completed"
    assert res.output_text == chat.choices[0].message.content
    assert res.usage.output_tokens == chat.usage.completion_tokens
    stream = client.responses.create(model="smollm2", input=INPUT, max_output_tokens=8, temperature=0, stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == res.output_text


def test_a_bare_string_input_and_bad_items(server):
    with server.client() as http:
        res = http.post("/v1/responses", json={"input": "Name a color.", "max_output_tokens": 4})
        assert res.status_code == 200 and res.json()["output"][0]["content"][0]["type"] == "output_text"
        for bad, text in (({"input": []}, "input"),
                          ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                           "input_image is not supported"),
                          ({"input": [{"type": "reasoning"}]}, "'reasoning'")):
            res = http.post("/v1/responses", json=bad)
            assert res.status_code == 400 and text in res.json()["error"]["message"], res.text
    assert httpx.post(server.url + "/responses", json={"input": "x", "max_output_tokens": 1}).status_code == 200


def test_input_tokens_counts_the_rendered_prompt(server):
    with server.client() as http:
        n = http.post("/v1/responses/input_tokens", json={"input": INPUT}).json()["input_tokens"]
        assert n == http.post("/chat/completions/input_tokens", json={"messages": INPUT}).json()["input_tokens"] > 0
