"""`llamactx serve`'s agent flags, as llama-server's (llama.cpp's common/arg.cpp): --tools, --tools-runtime,
--mcp-servers-config, --mcp-servers-json, --ui-mcp-proxy, --agent. Every one is off by default: the tools read,
write and run commands with the server's privileges, so never turn them on where untrusted clients can reach."""

from __future__ import annotations

import argparse

WARNING = "experimental, do not enable in untrusted environments"


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent tools (off by default; " + WARNING + ")")
    g.add_argument("--tools", default=None, metavar="TOOL1,TOOL2,...",
                   help="built-in tools served at /tools: 'all', or some of read_file, file_glob_search, grep_search,"
                        " exec_shell_command, write_file, edit_file, get_info")
    g.add_argument("--tools-runtime", default=None, metavar="OPTION",
                   help="run the tools in 'docker:<image>' / 'podman:<image>' (a container spawned now, removed at "
                        "exit), 'docker-container:<id>' / 'podman-container:<id>' (a running one) or 'ssh:<target>'")
    g.add_argument("--mcp-servers-config", default=None, metavar="PATH",
                   help="JSON file of stdio MCP servers (Cursor's {\"mcpServers\": {...}}); their tools join /tools "
                        "as <server>_<tool>")
    g.add_argument("--mcp-servers-json", default=None, metavar="JSON", help="the same, inline")
    g.add_argument("--ui-mcp-proxy", "--webui-mcp-proxy", dest="ui_mcp_proxy", action="store_true", default=False,
                   help="serve GET/POST /cors-proxy?url=... for the web UI's remote MCP servers")
    g.add_argument("--no-ui-mcp-proxy", "--no-webui-mcp-proxy", dest="ui_mcp_proxy", action="store_false")
    g.add_argument("-ag", "--agent", dest="agent", action="store_true", default=False,
                   help="--tools all and --ui-mcp-proxy together")
    g.add_argument("-no-ag", "--no-agent", dest="agent", action="store_false")


def agent_config_from_args(args: argparse.Namespace):
    """The AgentConfig of the flags. Raises ValueError (exit 1) for an unknown tool, a bad runtime, an MCP config
    file that cannot be read or JSON that does not parse, as llama-server refuses to start on them."""
    from llamactx.server.tools.mcp_config import load_mcp_servers
    from llamactx.server.tools.toolbox import AgentConfig, select_tools
    from llamactx.server.tools.tools_runtime import make_tools_runtime

    tools = [t.strip() for t in (args.tools or "").split(",") if t.strip()]
    if args.agent:
        tools = ["all"]
    select_tools(tools)
    if args.tools_runtime:
        try:
            make_tools_runtime(args.tools_runtime)  # checked, not started
        except ValueError as e:
            raise ValueError(f"--tools-runtime {args.tools_runtime!r}: {e}") from None
    servers = load_mcp_servers(args.mcp_servers_config, args.mcp_servers_json)
    return AgentConfig(tools=tools, tools_runtime=args.tools_runtime or "", mcp_servers=servers,
                       ui_mcp_proxy=args.ui_mcp_proxy or args.agent)
