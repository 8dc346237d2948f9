"""llama-cpp-python's server settings (llama_cpp/server/settings.py): the model's (the Llama keywords plus the
server's model options) and the HTTP server's, with its field names and defaults. A setting llamactx's server has
no counterpart for is refused at start-up by `app.server_config` with its name (ValueError).

llama-cpp-python's settings are pydantic-settings' BaseSettings, which fill a field not given from the environment
variable of its name (MODEL=..., N_CTX=...); here that is `from_env`, which `create_app()` and the command line use,
and `config_file_settings` reads $CONFIG_FILE / --config_file (JSON, or YAML when PyYAML is installed)."""

from __future__ import annotations

import json
import os
import typing
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field


class ModelSettings(BaseModel):
    model: str = Field(description="The path to the model (or an embedded model name: smollm2, gemma3).")
    model_alias: str | None = Field(default=None, description="The alias of the model in responses.")
    n_gpu_layers: int = 0
    split_mode: int = 1
    main_gpu: int = 0
    tensor_split: list[float] | None = None
    vocab_only: bool = False
    use_mmap: bool = True
    use_mlock: bool = False
    kv_overrides: list[str] | None = None
    rpc_servers: str | None = None
    seed: int = 0xFFFFFFFF
    n_ctx: int = Field(default=2048, ge=0)
    n_batch: int = Field(default=512, ge=1)
    n_ubatch: int = Field(default=512, ge=0)
    n_threads: int | None = Field(default=None, ge=1)
    n_threads_batch: int | None = Field(default=None, ge=1)
    rope_scaling_type: int = -1
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_orig_ctx: int = 0
    mul_mat_q: bool = True
    logits_all: bool = True
    embedding: bool = False
    offload_kqv: bool = True
    flash_attn: bool = False
    last_n_tokens_size: int = Field(default=64, ge=0)
    lora_base: str | None = None
    lora_path: str | None = None
    numa: bool | int = False
    chat_format: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    clip_model_path: str | None = None
    cache: bool = False
    cache_type: Literal["ram", "disk"] = "ram"
    cache_size: int = 2 << 30
    hf_tokenizer_config_path: str | None = None
    hf_pretrained_model_name_or_path: str | None = None
    hf_model_repo_id: str | None = None
    draft_model: str | None = None
    draft_model_num_pred_tokens: int = 10
    type_k: int | None = None
    type_v: int | None = None
    verbose: bool = True
    # llamactx only: requests decoded together (llama-server's -np); llama-cpp-python serves one at a time
    n_parallel: int = Field(default=4, ge=1, le=256)


class ServerSettings(BaseModel):
    host: str = "localhost"
    port: int = 8000
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    api_key: str | None = None
    interrupt_requests: bool = True
    disable_ping_events: bool = False
    root_path: str = ""


class Settings(ServerSettings, ModelSettings):
    pass


class ConfigFileSettings(ServerSettings):
    models: list[ModelSettings] = Field(default_factory=list)


S = TypeVar("S", bound=BaseModel)


def _is_complex(annotation: Any) -> bool:
    """A field pydantic-settings decodes from JSON text (lists, dicts, models)."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return any(typing.get_origin(k) in (list, dict) or k in (list, dict) for k in kinds)


def from_env(cls: type[S], given: dict[str, Any] | None = None, environ: typing.Mapping[str, str] | None = None) -> S:
    """`cls` from `given`, each field not given read from the environment variable of its name in any case
    (pydantic-settings' BaseSettings, as llama-cpp-python's settings read it); list and dict fields as JSON.
    Raises pydantic's ValidationError (a ValueError) naming a bad value."""
    given = dict(given or {})
    env = {k.lower(): v for k, v in (os.environ if environ is None else environ).items()}
    for name, field in cls.model_fields.items():
        if name not in given and name in env:
            raw = env[name]
            try:
                given[name] = json.loads(raw) if _is_complex(field.annotation) else raw
            except json.JSONDecodeError as e:
                raise ValueError(f"{name.upper()} = {raw!r}: a JSON value is expected ({e})") from None
    return cls.model_validate(given)


def config_file_settings(path: str) -> ConfigFileSettings:
    """The settings of a config file: JSON, or YAML for a .yaml / .yml name (as llama-cpp-python reads them)."""
    if not os.path.exists(path):
        raise ValueError(f"Config file {path} not found!")
    with open(path, "rb") as f:
        if path.endswith((".yaml", ".yml")):
            import yaml

            return ConfigFileSettings.model_validate_json(json.dumps(yaml.safe_load(f)))
        return ConfigFileSettings.model_validate_json(f.read())
