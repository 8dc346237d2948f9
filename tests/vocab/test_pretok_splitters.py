"""The hand-written splitters of unicode.cpp that no ggml-vocab file exercises fully, against line-by-line ports.

pretok.py runs unicode_regex_split_custom_qwen35 and _kimi_k2 as patterns over the collapsed text and
_afmoe (also tiny_aya's digit groups) as a loop; the ports below follow the C++ statement by statement, and
random texts over an alphabet of every category the splitters tell apart must split the same way.
"""

from __future__ import annotations

import random

import pytest

from llamactx.vocab.pretok import AFMOE_DIGITS, KIMI_K2, QWEN35, PreTokenizer, collapse_char

ALPHABET = (
    "aZ'sStTdDmMlLrReEvV \t\n\r\x0b\x0c09.,!-é日中\U00020000の한١\u00a0\u3000😀\u0301\u0300…\u0378ſK"
)


def _flag(text: str, pos: int) -> str | None:
    # unicode_cpt_flags: W(hitespace) / L(etter) / N(umber) / M(ark) / O(ther); None out of range (no flags)
    if not 0 <= pos < len(text):
        return None
    c = text[pos]
    k = c if c.isascii() else collapse_char(c)
    if k in "\t\n\x0b\x0c\r ":
        return "W"
    if k.isascii() and k.isalpha() or k == "\xd2":
        return "L"
    if k.isascii() and k.isdigit() or k == "\xd1":
        return "N"
    return "M" if k == "\xd4" else "O"


def _han(text: str, pos: int) -> bool:
    # unicode_cpt_is_han
    ranges = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
    return 0 <= pos < len(text) and any(lo <= ord(text[pos]) <= hi for lo, hi in ranges)


class _Port:
    """The shared frame of unicode.cpp's custom splitters: _get_flags, _add_token, the contraction check and the
    whitespace tail."""

    def __init__(self, text: str) -> None:
        self.text, self.n, self.out, self.prev = text, len(text), [], 0

    def add(self, end: int) -> None:
        if end > self.prev:
            self.out.append(self.text[self.prev : end])
        self.prev = end

    def low(self, pos: int) -> str:
        c = self.text[pos] if pos < self.n else ""
        return c.lower() if c.isascii() else c

    def contraction(self, pos: int) -> int:
        """Length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at pos (0 for none), with llama.cpp's bounds checks."""
        if pos < self.n and self.text[pos] == "'" and pos + 1 < self.n:
            if self.low(pos + 1) in "stmd":
                return 2
            if pos + 2 < self.n and self.low(pos + 1) + self.low(pos + 2) in ("re", "ve", "ll"):
                return 3
        return 0

    def whitespace(self, pos: int) -> int:
        nws, last_rn = 0, 0
        while _flag(self.text, pos + nws) == "W":
            if self.text[pos + nws] in "\r\n":
                last_rn = pos + nws + 1
            nws += 1
        if last_rn > 0:
            return last_rn
        if nws > 1 and pos + nws < self.n:
            return pos + nws - 1
        return pos + nws if nws > 0 else pos + 1


def _ref_qwen35(text: str) -> list[str]:
    p, pos = _Port(text), 0
    while pos < p.n:
        c, f = text[pos], _flag(text, pos)
        if k := p.contraction(pos):
            pos += k
            p.add(pos)
            continue
        if not (c in "\r\n" or f == "N") and (f in ("L", "M") or _flag(text, pos + 1) in ("L", "M")):
            pos += 1
            while _flag(text, pos) in ("L", "M"):
                pos += 1
            p.add(pos)
            continue
        if f == "N":
            pos += 1
            p.add(pos)
            continue
        f2 = _flag(text, pos + 1) if c == " " else f
        if f2 not in ("W", "L", "M", "N"):  # and flags.as_uint() of c itself: never 0 in range
            pos += c == " "
            while _flag(text, pos) == "O":
                pos += 1
            while pos < p.n and text[pos] in "\r\n":
                pos += 1
            p.add(pos)
            continue
        pos = p.whitespace(pos)
        p.add(pos)
    return p.out


def _ref_kimi_k2(text: str) -> list[str]:
    p, pos = _Port(text), 0

    def letter(i: int) -> bool:
        return _flag(text, i) == "L" and not _han(text, i)

    while pos < p.n:
        c, f = text[pos], _flag(text, pos)
        if _han(text, pos):
            while _han(text, pos):
                pos += 1
            p.add(pos)
            continue
        leading_ok = not (c in "\r\n" or f in ("L", "N"))
        if letter(pos) or (leading_ok and letter(pos + 1)):
            has_leading = leading_ok
            pos += has_leading
            has_letters = False
            while letter(pos):
                has_letters, pos = True, pos + 1
            if has_letters or (not has_leading and letter(pos)):
                pos += not has_letters
                while letter(pos):
                    pos += 1
                pos += p.contraction(pos)
                p.add(pos)
                continue
            if has_leading:
                pos -= 1
        if f == "N":
            ini = pos
            while _flag(text, pos) == "N":
                pos += 1
                if pos - ini >= 3:
                    p.add(pos)
                    ini = pos
            p.add(pos)
            continue
        f2 = _flag(text, pos + 1) if c == " " else f
        if f2 not in ("W", "L", "N") and f2 is not None:
            pos += c == " "
            while _flag(text, pos) not in ("W", "L", "N", None):
                pos += 1
            while pos < p.n and text[pos] in "\r\n":
                pos += 1
            p.add(pos)
            continue
        pos = p.whitespace(pos)
        p.add(pos)
    return p.out


def _ref_afmoe(text: str) -> list[str]:
    p, pos = _Port(text), 0
    while pos < p.n:
        if _flag(text, pos) == "N":
            start = pos
            while _flag(text, pos) == "N" and pos < p.n:
                pos += 1
            current = start
            if (pos - start) % 3:
                current += (pos - start) % 3
                p.add(current)
            while current < pos:
                current += 3
                p.add(current)
            continue
        pos += 1
    p.add(p.n)
    return p.out


@pytest.mark.parametrize(("expr", "port"), [(QWEN35, _ref_qwen35), (KIMI_K2, _ref_kimi_k2),
                                            (AFMOE_DIGITS, _ref_afmoe)])
def test_custom_splitters_match_unicode_cpp(expr, port):
    pre = PreTokenizer((expr,))
    rng = random.Random(2)
    for _ in range(600):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 24)))
        assert pre.split(text) == port(text), repr(text)


def test_splitters_split_every_piece_of_the_stage_before():
    # unicode_regex_split: a later regex never joins what an earlier one cut (afmoe: digit groups, then words)
    pre = PreTokenizer((AFMOE_DIGITS, KIMI_K2))
    assert pre.split("ab1234567 x") == ["ab", "1", "234", "567", " x"]
    assert pre.split("日本1234") == ["日本", "1", "234"]
