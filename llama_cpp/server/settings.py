"""llama-cpp-python's server settings (llama_cpp/server/settings.py): the model's (the Llama keywords plus the
server's model options) and the HTTP server's, with its field names and defaults. A setting llamactx's server has
no counterpart for is refused at start-up by `app.server_config` with its name (ValueError)."""

from __future__ import annotations

from typing import Any, Literal

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
