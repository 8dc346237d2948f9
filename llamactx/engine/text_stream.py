"""Token bytes in, printable text out (llama-server's `validate_utf8` + stop-string search in `process_token`).

A chunk of text never holds part of a UTF-8 character, and text that could be the start of a stop string is held
back until it is known not to be one; the stop string itself is never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    """Bytes in, printable text out: holds back an incomplete UTF-8 sequence and any tail that could begin a stop
    string; reports the first stop string found."""

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self.pending = b""  # bytes not yet decodable
        self.held = ""  # decoded text not yet emitted (could start a stop string)
        self.text = ""  # everything emitted
        self.stop_word: str | None = None

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        self.pending += piece
        cut = _complete_utf8_prefix(self.pending)
        self.held += self.pending[:cut].decode("utf-8", "replace")
        self.pending = self.pending[cut:]
        for s in self.stop:
            at = self.held.find(s)
            if at >= 0:
                self.stop_word = s
                return self._emit(self.held[:at], keep="")
        keep = max((_overlap(self.held, s) for s in self.stop), default=0)
        return self._emit(self.held[: len(self.held) - keep], keep=self.held[len(self.held) - keep :])

    def flush(self) -> str:
        """The end of generation: emit what is held (an incomplete character becomes U+FFFD)."""
        if self.stop_word is not None:
            return ""
        tail = self.held + self.pending.decode("utf-8", "replace")
        self.pending = b""
        return self._emit(tail, keep="")

    def _emit(self, out: str, keep: str) -> str:
        self.held = keep
        self.text += out
        return out


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return n if back >= need else n - back
    return n


def _overlap(text: str, stop: str) -> int:
    """Longest suffix of `text` that is a proper prefix of `stop`."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0
