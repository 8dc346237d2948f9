"""llama-server's job over the engine (tools/server): the HTTP app (app.py), completions and SSE (completions.py),
the engine thread (worker.py), slots and their files (slots.py), Prometheus metrics (metrics.py), Ollama's API
(ollama_routes.py), router mode over many models (model_router.py: the entries and the --models-max rule;
router_app.py: its routes, forwarding each request to its model's app) and the chat page (static/). The request
and response shapes it speaks are llamactx.api's, shared with `Llama`.

    config.py       ServerConfig (llama-server's command line) and ServerState (the loaded model, engine, worker)
    app.py          create_app: the routes (registered in one place), middlewares and llama-server's errors
    routes_info.py  /health, /models, /props, /metrics, the chat page; /tokenize, /detokenize, /apply-template
    routes_generation.py  the completion and chat routes (OpenAI, llama-server, Anthropic, Responses), /infill
    routes_embedding.py   /v1/embeddings and /rerank, run as jobs on the engine thread
    routes_admin.py /slots (and slot files), /lora-adapters
    prompts.py      a request's input as tokens (prompts, chat renders, embedding and rerank inputs), length-checked
    completions.py  the generation endpoints' engine side: choices as engine sequences, JSON or SSE out
    worker.py       EngineWorker: the engine's own thread, requests and jobs in, chunks out
    slots.py        /slots and slot files (save, restore, erase)
    metrics.py      /metrics in llama-server's Prometheus format
    prompt_cache.py --cache-ram / --cache-idle-slots: prompts kept in RAM beyond the slots
    streams.py      resumable streams (X-Conversation-Id): a stream that outlives its connection
    lifecycle.py    the model's life: loading, ready, asleep (--sleep-idle-seconds); HoldModel
    middleware.py   API keys, the body bound, CORS, canonical header names (pure ASGI)
    http.py         the HTTP transport: uvicorn's h11 protocol with llama-server's bounds
    gcp.py          Vertex AI's prediction protocol (POST {"instances": [...]}) over the app's own routes
    cors_proxy.py   the web UI's CORS proxy for remote MCP servers (--ui-mcp-proxy)
    ollama_routes.py  Ollama's API (/api/chat, /api/generate, /api/embed ...) over the same pipelines
    model_router.py router mode's model entries and the --models-max rule
    router_app.py   router mode's routes: each request forwarded to its model's app
    tools/          the agent tools of the chat page (--tools, MCP servers)
"""
