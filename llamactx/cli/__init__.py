"""The `llamactx` command line, llama.cpp's tools/ in one command (main.py parses; one module per tool)."""

from llamactx.cli.main import main

__all__ = ["main"]
