"""llama-server's job over the engine (tools/server): the HTTP app (app.py), completions and SSE (completions.py),
the engine thread (worker.py), slots and their files (slots.py), Prometheus metrics (metrics.py), Ollama's API
(ollama_routes.py), router mode over many models (model_router.py: the entries and the --models-max rule;
router_app.py: its routes, forwarding each request to its model's app) and the chat page (static/). The request
and response shapes it speaks are llamactx.api's, shared with `Llama`."""
