"""llama-server's job over the engine (tools/server): the HTTP app (app.py), the OpenAI / llama-server wire shapes
(protocol.py, responses.py), completions and SSE (completions.py), the engine thread (worker.py), slots and their
files (slots.py), Prometheus metrics (metrics.py) and the chat page (static/)."""
