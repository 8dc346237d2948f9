"""The `llamactx` command line, llama.cpp's tools/ in one command: commands.py builds the parser and runs the small
commands, args.py holds the flags the tools share (llama.cpp's common/arg.cpp); completion.py (run), chat.py,
bench.py, perplexity.py (kld.py: its KL-divergence file and statistics), embedding.py, quantize.py and serve.py are the
larger tools (quantize_types.py: which type each tensor gets, llama_tensor_get_type); agent.py holds `serve`'s
agent flags (--tools, --mcp-servers-*), gguf_split.py is `llamactx gguf-split` (llama-gguf-split), imatrix.py
`llamactx imatrix` (llama-imatrix)."""

from llamactx.cli.commands import main

__all__ = ["main"]
