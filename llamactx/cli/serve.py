"""`llamactx serve`: the OpenAI-compatible server with continuous batching (llama.cpp's tools/server), with
llama-server's flag names. Binds 127.0.0.1:8080 by default; the chat page is at its root."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import sys
from pathlib import Path

from llamactx.cli.agent import add_agent_flags, agent_config_from_args
from llamactx.cli.args import (
    ArgumentParser,
    CommandError,
    add_common,
    add_context,
    add_llama_cpp_flags,
    add_lora,
    add_pooling,
    add_sampling,
    add_speculative,
    read_text,
    runtime_params,
    sampling_options,
)
from llamactx.cluster.options import DEFAULT_ROUTING, ROUTINGS, ClusterOptions


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server: many users, one model (llama-server)")
    add_common(p)
    add_context(p, n_ctx=4096, engine=True)
    add_llama_cpp_flags(p)
    add_sampling(p)  # every request's defaults, as llama-server's sampling flags
    add_speculative(p)
    p.add_argument("-a", "--alias", default=None, help="model name in the API (default: the file name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("-np", "--parallel", type=int, default=None,
                   help="slots: requests decoded together (default 4, sharing -c as one pool; with -np N each slot "
                        "gets -c / N unless --kv-unified, as llama-server)")
    p.add_argument("--api-key", action="append", default=[], help="API key (repeatable); none: no auth")
    p.add_argument("--api-key-file", default=None, help="file with one API key per line")
    p.add_argument("--cors-origin", "--cors-origins", dest="cors_origin", action="append", default=[],
                   help="browser origins given CORS headers (repeatable or comma-separated): 'localhost' (any port "
                        "of localhost / 127.0.0.1 / [::1]), '*' (any), or exact origins; default, as llama-server: "
                        "'*', or 'localhost' when --tools / MCP servers are enabled")
    p.add_argument("--tags", default=None, help="comma-separated model tags shown by /v1/models")
    p.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="a built-in template name (llama.cpp's llama_chat_builtin_templates: chatml, llama2, "
                        "llama3, mistral-v7, phi3, gemma, deepseek3 ...; or a llama-cpp-python chat_format "
                        "name) or a Jinja template, instead of the model's; an unknown name is refused")
    p.add_argument("--chat-template-file", default=None, help="a file with the Jinja chat template to use")
    p.add_argument("--jinja", action="store_true", help="accepted: chat templates are always Jinja here")
    p.add_argument("--no-jinja", action="store_true",
                   help="accepted with a notice: the model's template is rendered with Jinja (llama.cpp's built-in "
                        "formats give the same prompts for chatml, llama3, gemma)")
    p.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                   help="accepted: /v1/embeddings is always served beside generation")
    add_pooling(p)
    p.add_argument("--reranking", "--rerank", dest="reranking", action="store_true",
                   help="serve /rerank (/v1/rerank, /reranking): rank pooling, the score is element 0 of the last "
                        "token's hidden state for a model without a classifier head (llama.cpp's); without it "
                        "/rerank answers 501")
    p.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=None,
                   help="each slot may use the whole -c while memory lasts (the default without -np)")
    p.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false",
                   help="each slot gets -c / -np (the default with -np)")
    p.add_argument("-cb", "--cont-batching", action="store_true", help="accepted: batching is always continuous")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request and debug line")
    p.add_argument("--backend-sampling", "--backend_sampling", dest="backend_sampling", action="store_true",
                   help="accepted with a notice: sampling runs on the CPU, after the decode")
    p.add_argument("--metrics", action="store_true", help="enable GET /metrics (Prometheus)")
    p.add_argument("-cram", "--cache-ram", type=float, default=0, metavar="MiB",
                   help="keep up to this many MiB of prompts (slot states) in RAM beyond the slots, and let the "
                        "server choose slots as llama-server does (default 0: off; -1: no limit)")
    p.add_argument("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=True,
                   help="with --cache-ram: save idle slots to it when a request starts, clearing them with -kvu "
                        "(default)")
    p.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false",
                   help="do not save and clear idle slots")
    p.add_argument("--sleep-idle-seconds", type=float, default=-1, metavar="N",
                   help="after N seconds without requests, unload the model (its memory freed; /props reports "
                        "is_sleeping) until the next request reloads it (default -1: never)")
    p.add_argument("--slots", dest="slots", action="store_true", default=True, help="enable GET /slots (default)")
    p.add_argument("--no-slots", dest="slots", action="store_false", help="disable GET /slots")
    p.add_argument("--no-webui", "--no-ui", dest="no_webui", action="store_true", help="do not serve the chat page")
    p.add_argument("--context-shift", action="store_true", help="shift the context instead of stopping when full")
    p.add_argument("--slot-save-path", default=None, help="directory for POST /slots/{id}?action=save|restore")
    p.add_argument("-to", "--timeout", type=float, default=600.0, help="a request's deadline in seconds (600)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting beyond the slots before 503 (default 64)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds for a request's headers and body to arrive, else 408 and close (default 30)")
    p.add_argument("--max-connections", type=int, default=256,
                   help="open connections before a new one is answered 503 (default 256)")
    p.add_argument("--embd-max-inputs", type=int, default=8192,
                   help="inputs one /v1/embeddings request may hold (default 8192)")
    add_lora(p)
    p.add_argument("--lora-init-without-apply", action="store_true",
                   help="load the LoRA adapters at scale 0 (set scales later with POST /lora-adapters)")
    add_agent_flags(p)  # --tools, --mcp-servers-*, --ui-mcp-proxy: off by default
    add_router_flags(p)
    add_cluster_flags(p)
    p.set_defaults(func=cmd_serve)
    return p


def add_router_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's router mode (server/model_router.py): many models, loaded by the request's "model"."""
    g = p.add_argument_group("router mode: many models (llama-server's --models-dir)")
    g.add_argument("--models-dir", default=None, metavar="PATH",
                   help="serve every GGUF file of this directory (NAME.gguf is model NAME; a subdirectory NAME with "
                        "GGUF files is model NAME), each loaded when a request names it in \"model\"; every other "
                        "flag applies to each model (not with -m)")
    g.add_argument("--models-preset", default=None, metavar="PATH",
                   help="INI file of model presets: [NAME] sections of flags without dashes (model = PATH, c = 8192, "
                        "...; [*] for all, load-on-startup = true), as llama-server's")
    g.add_argument("--models-max", type=int, default=4, metavar="N",
                   help="models loaded at once at most; the least recently used idle one is unloaded for another "
                        "(default 4, 0 = unlimited)")
    g.add_argument("--models-autoload", dest="models_autoload", action="store_true", default=True,
                   help="load a model when a request names it (default)")
    g.add_argument("--no-models-autoload", dest="models_autoload", action="store_false",
                   help="refuse requests for a model not loaded (load it with POST /models/load)")


def router_specs(args, parser: argparse.ArgumentParser) -> list:
    """The models of --models-dir and --models-preset as router ModelSpecs, each with the ServerConfig of these
    flags, a preset's options over them where the command line left the default (llama-server's precedence:
    command line, then the model's section, then [*])."""
    from llamactx.server.model_router import ModelSpec, models_in_dir, read_preset

    try:
        found = models_in_dir(args.models_dir) if args.models_dir else {}
        common, sections = read_preset(args.models_preset) if args.models_preset else ({}, {})
    except ValueError as e:
        raise CommandError(str(e)) from None
    specs = []
    for name in [*found, *(s for s in sections if s not in found)]:
        options = {**common, **sections.get(name, {})}
        on_startup = options.pop("load-on-startup", "false").lower() in ("1", "true", "on", "yes")
        for key in ("stop-timeout", "dedup-cache-models", "version"):
            options.pop(key, None)
        given = options.pop("model", None) or options.pop("m", None)
        aliases = [a.strip() for a in (options.pop("alias", None) or options.pop("a", None) or "").split(",")
                   if a.strip()]
        path = Path(given) if given else found.get(name)
        if path is None:
            raise CommandError(f"--models-preset: [{name}] names no model file (model = PATH) and no file of "
                               "--models-dir has that name")
        margs = _with_options(args, parser, options, name)
        margs.model, margs.alias = str(path), None
        specs.append(ModelSpec(name, path, config_from_args(margs), aliases=aliases,
                               source="preset" if name in sections else "models_dir",
                               preset=sections.get(name, {}), load_on_startup=on_startup))
    if not specs:
        raise CommandError(f"router mode: no model found ({args.models_dir or args.models_preset})")
    return specs


def _with_options(args, parser: argparse.ArgumentParser, options: dict, section: str):
    """`args` with a preset section's options (flag names without dashes) set where the command line left the
    flag's default."""
    out = argparse.Namespace(**vars(args))
    flags = parser._option_string_actions  # argparse's own table of option strings
    for key, value in options.items():
        action = flags.get(f"--{key}") or flags.get(f"-{key}")
        if action is None:
            raise CommandError(f"--models-preset: [{section}] {key}: not a `llamactx serve` flag")
        if getattr(args, action.dest) != parser.get_default(action.dest):
            continue  # given on the command line: it wins
        try:
            if action.nargs == 0:
                on = value.strip().lower() in ("1", "true", "on", "yes", "")
                setattr(out, action.dest, action.const if on else not action.const)
            else:
                typed = action.type(value) if action.type else value
                setattr(out, action.dest, [typed] if isinstance(action, argparse._AppendAction) else typed)
        except (TypeError, ValueError) as e:
            raise CommandError(f"--models-preset: [{section}] {key} = {value!r}: {e}") from None
    return out


def parse_router_flags(flags: str | list[str]):
    """Router-mode `llamactx serve` flags as (ServerConfig, [ModelSpec], models_max, autoload, reload), the
    arguments of server/router_app.py's create_router_app."""
    parser = ArgumentParser(prog="llamactx")
    serve = add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(shlex.split(flags) if isinstance(flags, str) else flags)])
    return _router(args, serve)


def _router(args, serve_parser):
    if args.model is not None:
        raise CommandError("-m and --models-dir / --models-preset exclude each other: router mode serves the "
                           "models of the directory or preset")
    if args.models_max < 0:
        raise CommandError(f"--models-max = {args.models_max} must be >= 0 (0: no limit)")
    return (config_from_args(args), router_specs(args, serve_parser), args.models_max, args.models_autoload,
            lambda: router_specs(args, serve_parser))


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """Replicas on Ray Serve (llamactx/cluster/, docs/scaling.md; needs `pip install llamactx[cluster]`)."""
    g = p.add_argument_group("replicas on Ray Serve (docs/scaling.md)")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="serve with N engine replicas (processes) behind Ray Serve's HTTP proxy on --host:--port, "
                        "on a local Ray (all on 127.0.0.1) or the cluster RAY_ADDRESS names; each replica has "
                        "these flags' slots, context and -t threads (default: one process, no Ray)")
    g.add_argument("--max-replicas", type=int, default=None, metavar="M",
                   help="with --replicas N: autoscale between N and M replicas on the requests per replica "
                        "(Ray Serve's autoscaling_config; default: M = N, no autoscaling)")
    g.add_argument("--target-ongoing", type=int, default=None, metavar="R",
                   help="with --max-replicas: the requests (running + queued) per replica that autoscaling aims "
                        "at (Ray Serve's target_ongoing_requests; default -np)")
    g.add_argument("--routing", choices=ROUTINGS, default=DEFAULT_ROUTING,
                   help="with --replicas: which replica gets a request: a conversation's next turn the one that "
                        "holds its history, a new one the replica holding the fewest, another when it is full "
                        "(affinity, the default), or each in turn (round-robin)")


def cluster_options(args):
    """The ClusterOptions of --replicas, --max-replicas, --target-ongoing and --routing (cluster/options.py), None
    without --replicas; ClusterError names a flag out of its bounds."""
    if args.replicas is None:
        return None
    return ClusterOptions(replicas=args.replicas, max_replicas=args.max_replicas,
                          target_ongoing=args.target_ongoing, routing=args.routing)


def parse_flags(flags: str | list[str]):
    """`llamactx serve` flags (a shell-quoted string or a list) as (ServerConfig, ClusterOptions): one replica
    without --replicas."""
    parser = ArgumentParser(prog="llamactx")
    add_parser(parser.add_subparsers(dest="command", required=True))
    argv = shlex.split(flags) if isinstance(flags, str) else list(flags)
    args = parser.parse_args(["serve", *argv])
    if args.replicas is None:
        args.replicas = 1
    options = cluster_options(args)
    return config_from_args(args), options


def app_builder(builder_args: dict):
    """Ray's application builder for an existing cluster:
    `RAY_ADDRESS=... serve run llamactx.cli.serve:app_builder flags="-m MODEL --replicas 4 ..."`."""
    from llamactx.cluster.launch import build_app

    return build_app(*parse_flags(builder_args.get("flags", "")))


def config_from_args(args):
    from llamactx.server.config import N_SLOTS_DEFAULT, ServerConfig

    keys = list(args.api_key)
    if args.api_key_file:
        keys += [line.strip() for line in Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    origins = [o.strip() for arg in args.cors_origin for o in arg.split(",") if o.strip()]
    n_slots = N_SLOTS_DEFAULT if args.parallel is None else args.parallel
    kv_unified = args.parallel is None if args.kv_unified is None else args.kv_unified  # llama-server's rule
    for name, value, lo in (("--parallel", n_slots, 1), ("--ctx-size", args.ctx_size, 256),
                            ("--max-queue", args.max_queue, 0), ("--port", args.port, 0),
                            ("--max-connections", args.max_connections, 1),
                            ("--embd-max-inputs", args.embd_max_inputs, 1)):
        if value < lo:
            raise ValueError(f"{name} = {value} must be >= {lo}")
    if not args.read_timeout > 0:
        raise ValueError(f"--read-timeout = {args.read_timeout} must be > 0")
    if args.slot_save_path and not Path(args.slot_save_path).is_dir():
        raise ValueError(f"--slot-save-path {args.slot_save_path!r} is not a directory")
    if args.backend_sampling:
        print("llamactx: --backend-sampling ignored: sampling runs on the CPU, after the decode", file=sys.stderr)
    if args.no_jinja:
        print("llamactx: --no-jinja: the chat template is rendered with Jinja all the same", file=sys.stderr)
    template = args.chat_template
    if args.chat_template_file:
        template = read_text(args.chat_template_file, "chat template file")
    if template:
        from llamactx.chat_template import ChatTemplate

        ChatTemplate(template)  # a template that does not compile stops the server at start, named
    tags = [t.strip() for t in (args.tags or "").split(",") if t.strip()]
    gcp = os.environ.get("AIP_MODE", "") == "PREDICTION"  # Vertex AI (llama-server's GCP compat)
    if gcp and os.environ.get("AIP_HTTP_PORT"):
        args.port = int(os.environ["AIP_HTTP_PORT"])
    agent = agent_config_from_args(args)
    if not origins:  # llama-server's default (common/arg.cpp): any origin, localhost while tools can run
        origins = ["localhost"] if agent.tools or agent.mcp_servers else ["*"]
    lora = tuple((path, 0.0 if args.lora_init_without_apply else scale) for path, scale in args.lora)
    runtime = runtime_params(args, n_slots=n_slots, kv_unified=kv_unified, chat_template=template,
                             pooling=args.pooling, lora=lora, embd_n_ctx=None)
    return ServerConfig(runtime=runtime, alias=args.alias, tags=tags, request_defaults=request_defaults(args),
                        gcp_predict_route=os.environ.get("AIP_PREDICT_ROUTE") or "/predict" if gcp else None,
                        gcp_health_route=os.environ.get("AIP_HEALTH_ROUTE") or None if gcp else None,
                        api_keys=keys, cors_origins=origins, metrics=args.metrics, slots=args.slots,
                        webui=not args.no_webui, context_shift=args.context_shift,
                        slot_save_path=args.slot_save_path, timeout=args.timeout, max_queue=args.max_queue,
                        read_timeout=args.read_timeout, max_connections=args.max_connections,
                        embd_max_inputs=args.embd_max_inputs, reranking=args.reranking,
                        sleep_idle_seconds=args.sleep_idle_seconds, cache_ram=args.cache_ram,
                        cache_idle_slots=args.cache_idle_slots, agent=agent)


def request_defaults(args) -> dict:
    """The sampling flags as the request fields they set when a request leaves them out (llama-server's
    `params.sampling` defaults)."""
    out = {"repeat_last_n" if k == "penalty_last_n" else k: list(v) if isinstance(v, tuple) else v
           for k, v in sampling_options(args).items()}
    out["n_predict"] = args.n_predict
    if args.grammar_file:
        out["grammar"] = read_text(args.grammar_file, "grammar file")
    elif args.grammar:
        out["grammar"] = args.grammar
    if args.json_schema:
        try:
            out["json_schema"] = json.loads(args.json_schema)
        except json.JSONDecodeError as e:
            raise CommandError(f"--json-schema is not JSON: {e}") from None
    from llamactx.api import protocol as P

    P.validate(P.CompletionRequest, {"prompt": "x", **out})  # a bad default is a start-up error, not every request's
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from llamactx.server.app import create_app
    from llamactx.server.http import uvicorn_config

    options = cluster_options(args)
    router = None
    if args.models_dir or args.models_preset:
        if options is not None:
            raise CommandError("--replicas with --models-dir / --models-preset is not supported: run one router")
        parser = ArgumentParser(prog="llamactx")
        router = _router(args, add_parser(parser.add_subparsers(dest="command")))
    config = router[0] if router else config_from_args(args)
    hosts = [h.strip() for h in args.host.split(",") if h.strip()]  # llama-server binds each of a comma list
    if not hosts:
        raise CommandError("--host names no address")
    if options is not None:  # only then is Ray imported
        from llamactx.cluster.launch import serve_replicas

        return serve_replicas(config, options, hosts[0], args.port, args.verbose)
    first = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
    config.url = f"http://{first}:{args.port}/"
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="llamactx: %(message)s")
    sockets = [_bind(h, args.port) for h in hosts]
    if router:
        from llamactx.server.router_app import create_router_app

        app = create_router_app(*router)
        print(f"llamactx serve: router over {len(router[1])} models ({', '.join(s.name for s in router[1])}), "
              f"at most {router[2] or 'any number'} loaded; the chat page will be at {config.url}",
              file=sys.stderr, flush=True)
    else:
        app = create_app(config)
        print(f"llamactx serve: loading {config.runtime.model or 'smollm2'}; the chat page will be at {config.url}",
              file=sys.stderr, flush=True)
    if not args.cors_origin and config.cors_origins == ["localhost"]:  # config_from_args: tools are on
        print("llamactx: server tools or MCP servers are enabled: CORS answers localhost origins only (change "
              "with --cors-origins)", file=sys.stderr)
    if config.cors_origins == ["*"] and not config.api_keys:  # llama-server's warning (server.cpp)
        print("llamactx: security: no API key is set and CORS allows all origins: any web page this machine's "
              "browser opens can call this server (--api-key, or --cors-origins localhost)", file=sys.stderr)
    uvicorn.Server(uvicorn_config(app, config.read_timeout, config.max_connections, host=hosts[0],
                                  port=args.port)).run(sockets=sockets)
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CommandError(f"--host {host} --port {port}: cannot bind: {e.strerror or e}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
