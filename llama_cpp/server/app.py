"""llama-cpp-python's server app (llama_cpp/server/app.py's create_app) as llamactx's server: `server_config`
maps llama-cpp-python's settings onto llamactx.server's ServerConfig through the same option handling as
`Llama(...)` (llamactx.llama_cpp_options.runtime_params), so a setting means what it means for Llama."""

from __future__ import annotations

import os
from dataclasses import replace

from llamactx.llama_cpp_options import LlamaPromptLookupDecoding, runtime_params
from llamactx.server.config import ServerConfig

from .settings import ModelSettings, ServerSettings, Settings, config_file_settings, from_env

# settings whose llama-cpp-python meaning llamactx's server does not have: refused unless left at their default
_REFUSED = {
    "rpc_servers": "there are no RPC backends",
    "clip_model_path": "multimodal (llava / mtmd) models are not served",
    "chat_template_kwargs": "the chat template takes no extra arguments here",
    "hf_tokenizer_config_path": "the model's own chat template and vocabulary are used",
    "hf_pretrained_model_name_or_path": "the model's own vocabulary is used",
    "hf_model_repo_id": "pass a local GGUF path as --model",
}


def _llama_kwargs(m: ModelSettings) -> dict:
    """The Llama keywords of the model settings (draft_model and cache handled by the caller)."""
    skip = {"model", "model_alias", "rpc_servers", "mul_mat_q", "chat_template_kwargs", "clip_model_path", "cache",
            "cache_type", "cache_size", "hf_tokenizer_config_path", "hf_pretrained_model_name_or_path",
            "hf_model_repo_id", "draft_model", "draft_model_num_pred_tokens", "n_parallel"}
    kw = {k: v for k, v in m.model_dump().items() if k in ModelSettings.model_fields and k not in skip}
    if m.kv_overrides:
        kw["kv_overrides"] = dict(item.split("=", 1) for item in m.kv_overrides)
    if m.draft_model is not None:
        if m.draft_model != "prompt-lookup-decoding":
            raise ValueError(f"draft_model = {m.draft_model!r}: only 'prompt-lookup-decoding' is supported")
        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=m.draft_model_num_pred_tokens)
    return kw


def server_config(settings: Settings | ModelSettings, server: ServerSettings | None = None) -> ServerConfig:
    """llamactx's ServerConfig for llama-cpp-python's settings. ValueError naming a refused setting."""
    server = server or (settings if isinstance(settings, ServerSettings) else ServerSettings())
    defaults = ModelSettings(model=settings.model)
    for name, why in _REFUSED.items():
        if getattr(settings, name) != getattr(defaults, name):
            raise ValueError(f"{name} = {getattr(settings, name)!r}: {why}")
    if settings.cache and settings.cache_type == "disk":
        raise ValueError("cache_type = 'disk': the server keeps prompts in RAM (--cache_type ram)")
    opts, runtime = runtime_params(settings.model, _llama_kwargs(settings))
    runtime = replace(runtime, n_slots=settings.n_parallel, embd_n_ctx=None)
    return ServerConfig(runtime=runtime, alias=settings.model_alias or settings.model,
                        api_keys=[server.api_key] if server.api_key else [],
                        cache_ram=settings.cache_size / 2**20 if settings.cache else 0,
                        request_defaults={"seed": opts["seed"], "repeat_last_n": opts["last_n_tokens_size"]}
                        if opts["seed"] != 0xFFFFFFFF else {"repeat_last_n": opts["last_n_tokens_size"]})


def passive_omp_wait() -> None:
    """The compute threads (numba's OpenMP layer) wait for work asleep rather than spinning: between two steps the
    server's own threads (the event loop, the worker's sampling) need the cores that spinning OpenMP threads would
    hold. Measured with bench/llama_cpp_server_speed.py (4 clients, n_threads 2, a loaded 2-core machine): 4.1
    tokens/s spinning, 143 asleep. libgomp reads OMP_WAIT_POLICY when it starts (the first parallel kernel), so
    this acts only before any ran in this process; a policy already set is left as it is."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def create_app(settings: Settings | None = None, server_settings: ServerSettings | None = None,
               model_settings: list[ModelSettings] | None = None):
    """The llamactx server app for llama-cpp-python's settings, read as llama-cpp-python's create_app reads them:
    $CONFIG_FILE first, else `settings`, else Settings from the environment (MODEL=...). One model: a list of
    several is refused (ValueError), as are settings llamactx has no counterpart for (server_config)."""
    from llamactx.server.app import create_app as llamactx_app

    passive_omp_wait()
    config_file = os.environ.get("CONFIG_FILE")
    if config_file is not None:
        file_settings = config_file_settings(config_file)
        server_settings = ServerSettings.model_validate(file_settings.model_dump(exclude={"models"}))
        model_settings = file_settings.models
    if server_settings is None and model_settings is None:
        settings = settings if settings is not None else from_env(Settings)
        return llamactx_app(server_config(settings))
    if model_settings is None or len(model_settings) != 1:
        raise ValueError(f"models: {len(model_settings or [])} model configs; llamactx's server serves one model")
    return llamactx_app(server_config(model_settings[0], server_settings))
