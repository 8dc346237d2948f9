"""The wire shapes of the OpenAI API and llama-server's endpoints, shared by every front end that speaks them:
the HTTP server (llamactx.server) and llama-cpp-python's `Llama` class (llamactx.llama_cpp_python).

    protocol.py     requests (pydantic, validated: ProtocolError names the field), GenerationRequest (a request
                    as the engine takes it: sampler chain and limits), usage / timings / logprobs JSON
    responses.py    Renderers: a generation's JSON, whole or streamed (text completion, chat, /completion)
    ollama.py       Ollama's requests (/api/chat, /api/generate, options, keep_alive, format, think) as chat /
                    completion bodies
    ollama_responses.py  Ollama's answers (whole or NDJSON pieces, thinking, tool calls) and its model card
    anthropic.py    Anthropic's Messages API over the chat pipeline (/v1/messages, count_tokens)
    oai_responses.py  OpenAI's Responses API over the chat pipeline (/v1/responses)
    infill.py       fill-in-the-middle prompts for /infill (format_prompt_infill)
    rerank.py       /rerank's request, prompt and response (format_prompt_rerank, format_response_rerank)
"""
