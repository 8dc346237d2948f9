"""One base for every error llamactx raises on bad input or a failed operation.

`LlamactxError` is mixed into each specific exception (`GGUFError`, `ModelLoadError`, `ContextParamsError`,
`DecodeError`, `StateError`, `ChatTemplateError`, `GrammarError`, `GenerationError`...), which keep their
built-in base too (ValueError, RuntimeError), so `except ValueError` goes on working. The CLI and the server catch
`LlamactxError` and report its message in one line: it is the user's input or a documented limit, never a bug.
"""

from __future__ import annotations


class LlamactxError(Exception):
    """Base of llamactx's own exceptions: the message names the field, the value and the limit."""
