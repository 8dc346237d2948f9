"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server --model ...`), here llamactx's server
(llamactx.server: its routes /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models and llama-server's)
configured from llama-cpp-python's settings.

    settings.py  ModelSettings, ServerSettings, Settings: llama-cpp-python's names and defaults
    app.py       create_app(settings): the llamactx app; server_config(settings) -> ServerConfig
    __main__.py  the command line (one --flag per setting, or --config_file)
"""
