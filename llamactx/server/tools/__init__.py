"""The tools llama-server offers its chat page's agent (tools/server/server-tools.cpp, server-mcp.cpp): off unless
--tools, --mcp-servers-config / --mcp-servers-json turn them on (cli/agent.py).

toolbox.py: GET/POST /tools (the registry and its HTTP routes); builtin.py: the built-in tools (read_file,
file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info) with file_edit.py and
path_glob.py; isolates.py: where a tool runs (the host, a container, ssh), tools_runtime.py: --tools-runtime;
mcp.py + mcp_config.py: the MCP client (stdio JSON-RPC servers, their tools as "<server>_<tool>").
"""
