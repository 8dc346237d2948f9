"""`python -m llama_cpp.server --model model.gguf [--n_ctx 2048] [--host localhost] [--port 8000] ...`: llamactx's
server with llama-cpp-python's command line (one --flag per setting, as its cli.py derives them; or
--config_file / $CONFIG_FILE, a JSON file of ServerSettings plus one entry in "models"). A setting no flag gives
is read from the environment variable of its name (MODEL=..., as llama-cpp-python's BaseSettings read it)."""

from __future__ import annotations

import argparse
import os
import sys
import typing

from .settings import ServerSettings, Settings, config_file_settings, from_env


def _flag_type(annotation):
    """argparse's type for a settings field: bools take true/false, optionals their inner type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base is bool:
        return lambda s: s.lower() in ("1", "true", "yes", "on")
    if typing.get_origin(base) is list:
        return None  # nargs="*": see add_arguments
    return base if base in (int, float, str) else str


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llama_cpp.server",
                                description="llamactx's OpenAI-compatible server, llama-cpp-python's flags")
    for name, field in Settings.model_fields.items():
        kind = _flag_type(field.annotation)
        if kind is None:
            p.add_argument(f"--{name}", nargs="*", default=None, help=field.description)
        else:
            p.add_argument(f"--{name}", type=kind, default=None, help=field.description)
    p.add_argument("--config_file", type=str, help="a JSON config file (ConfigFileSettings)")
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from llamactx.server.http import uvicorn_config

    from .app import passive_omp_wait, server_config

    passive_omp_wait()
    args = parser().parse_args(argv)
    config_file = os.environ.get("CONFIG_FILE", args.config_file)
    try:
        if config_file:
            file_settings = config_file_settings(config_file)
            server = ServerSettings.model_validate(file_settings.model_dump(exclude={"models"}))
            if len(file_settings.models) != 1:
                raise ValueError(f"models: {len(file_settings.models)} model configs; llamactx serves one model")
            model = file_settings.models[0]
        else:
            given = {k: v for k, v in vars(args).items() if v is not None and k != "config_file"}
            model = from_env(Settings, given)  # what the flags leave unset, from the environment
            server = model
        config = server_config(model, server)
    except (ValueError, OSError) as e:  # pydantic's ValidationError is a ValueError
        print(f"llama_cpp.server: {e}", file=sys.stderr)
        return 2
    from llamactx.server.app import create_app

    app = create_app(config)
    print(f"llama_cpp.server (llamactx): loading {model.model}; listening on http://{server.host}:{server.port}",
          file=sys.stderr, flush=True)
    ssl = {k: v for k, v in (("ssl_keyfile", server.ssl_keyfile), ("ssl_certfile", server.ssl_certfile)) if v}
    uvicorn.Server(uvicorn_config(app, config.read_timeout, config.max_connections, host=server.host,
                                  port=server.port, root_path=server.root_path, **ssl)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
