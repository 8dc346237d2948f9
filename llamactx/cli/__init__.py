"""The `llamactx` command line, llama.cpp's tools/ in one command: commands.py parses the arguments and runs the
small commands; chat.py, bench.py and perplexity.py are the larger tools."""

from llamactx.cli.commands import main

__all__ = ["main"]
