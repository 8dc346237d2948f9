"""BPE pre-tokenization: split text into words the way llama.cpp's `unicode_regex_split` does.

llama.cpp (src/unicode.cpp) runs a list of regexes per pre-tokenizer type, each one splitting the pieces the
previous one produced. A regex that names Unicode categories (`\\p{L}`, `\\p{N}`, ...) runs with `std::regex`
over a "collapsed" copy of the text where every non-ASCII codepoint is replaced by one byte standing for its
category (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything else, 0x0B
whitespace); a regex without categories runs with `std::wregex` on the codepoints, non-ASCII whitespace again
mapped to 0x0B. The GPT-2, LLaMA-3 and Qwen2 regexes are not run as regexes at all but by hand-written
splitters (`unicode_regex_split_custom_gpt2/llama3/qwen2/newlines`).

We build the same collapsed text (categories from llama.cpp's tables: `unicodedata` plus the Unicode 15.x
additions below) and run Python `re` patterns over it: the std::regex ones translated exactly as
`unicode_regex_split` translates them, the hand-written splitters as patterns equivalent to their code
(checked against ports of that code in tests/vocab/test_vocab.py). Positions in the collapsed text are codepoint
positions in the original, so the words are slices of the original text.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

# llama.cpp's unicode-data.cpp comes from a newer UCD (15.1) than Python 3.10/3.11's unicodedata (13/14):
# (first, last, category letter) of the codepoints assigned since, as llama.cpp's table classifies them. With
# these the categories are exact for Python <= 3.13 (UCD <= 15.1); a newer UCD also knows later additions,
# which llama.cpp's table leaves unassigned.
_UCD_NEWER = (
    (0x0CF3, 0x0CF3, "M"),
    (0x0ECE, 0x0ECE, "M"),
    (0x2FFC, 0x2FFF, "S"),
    (0x31EF, 0x31EF, "S"),
    (0x10EFD, 0x10EFF, "M"),
    (0x1123F, 0x11240, "L"),
    (0x11241, 0x11241, "M"),
    (0x11B00, 0x11B09, "P"),
    (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "L"),
    (0x11F03, 0x11F03, "M"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F34, 0x11F3A, "M"),
    (0x11F3E, 0x11F42, "M"),
    (0x11F43, 0x11F4F, "P"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),
    (0x13440, 0x13440, "M"),
    (0x13441, 0x13446, "L"),
    (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"),
    (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"),
    (0x1E030, 0x1E06D, "L"),
    (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"),
    (0x1E4EC, 0x1E4EF, "M"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x1F6DC, 0x1F6DC, "S"),
    (0x1F774, 0x1F776, "S"),
    (0x1F77B, 0x1F77F, "S"),
    (0x1F7D9, 0x1F7D9, "S"),
    (0x1FA75, 0x1FA77, "S"),
    (0x1FA87, 0x1FA88, "S"),
    (0x1FAAD, 0x1FAAF, "S"),
    (0x1FABB, 0x1FABD, "S"),
    (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"),
    (0x1FADA, 0x1FADB, "S"),
    (0x1FAE8, 0x1FAE8, "S"),
    (0x1FAF7, 0x1FAF8, "S"),
    (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
_UCD_NEWER_STARTS = [first for first, _, _ in _UCD_NEWER]

# unicode-data.cpp: unicode_set_whitespace (the ASCII ones, \t..\r and ' ', stay themselves when collapsed)
_NON_ASCII_WHITESPACE = frozenset(
    [0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
# unicode_regex_split: k_ucat_cpt (the byte standing for a category in the collapsed text)
_CATEGORY_BYTE = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_OTHER_BYTE = "\xd0"
_WHITESPACE_BYTE = "\x0b"


def collapse_char(ch: str) -> str:
    """The collapsed stand-in of one non-ASCII character (`unicode_regex_split`'s text_collapsed)."""
    cpt = ord(ch)
    if cpt in _NON_ASCII_WHITESPACE:
        return _WHITESPACE_BYTE
    i = bisect_right(_UCD_NEWER_STARTS, cpt) - 1
    if i >= 0 and cpt <= _UCD_NEWER[i][1]:
        return _CATEGORY_BYTE[_UCD_NEWER[i][2]]
    return _CATEGORY_BYTE.get(unicodedata.category(ch)[0], _OTHER_BYTE)


# unicode_regex_split: k_ucat_enum + k_ucat_map (every letter subcategory collapses to LETTER, as in
# llama.cpp)
_UCAT_CLASS = {
    "N": "\xd1" + "0-9",
    "L": "\xd2" + "A-Za-z",
    "P": "\xd3" + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "\xd4",
    "S": "\xd5" + r"\$\+<->^`\|\~",
}
_UCAT_NAMES = {**{c: c for c in "NLPMS"}, **{f"L{c}": "L" for c in "ultmo"}}  # \p{Lu} etc. -> LETTER
_UCAT_RE = re.compile(r"\\p\{(" + "|".join(_UCAT_NAMES) + r")\}")

# The hand-written splitters as patterns over the collapsed text (W: llama.cpp's is_whitespace, L: is_letter,
# N: is_number; every codepoint has non-zero flags, so "no match" never happens and every character is
# covered).
_W, _L, _N = r"\t\n\x0b\x0c\r ", r"A-Za-z\xd2", r"0-9\xd1"
_WS_RUNS = rf"|[{_W}]+(?![^{_W}])|[{_W}]+"
# unicode_regex_split_custom_gpt2
_CUSTOM_GPT2 = rf"'(?:[stmd]|re|ve|ll)| ?[{_L}]+| ?[{_N}]+| ?[^{_W}{_L}{_N}]+" + _WS_RUNS


def _custom_llama3(numbers: str) -> str:
    # unicode_regex_split_custom_llama3 (numbers "{1,3}") and unicode_regex_split_custom_qwen2 (numbers "")
    return (
        rf"'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL])|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{numbers}"
        rf"| ?[^{_W}{_L}{_N}]+[\r\n]*|[{_W}]*[\r\n]+" + _WS_RUNS
    )


# llama-vocab.cpp: llm_tokenizer_bpe::llm_tokenizer_bpe, the regex_exprs of each pre-tokenizer type
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _LLAMA3_TAIL
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _LLAMA3_TAIL
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NEWLINES = r"[^\n]+|[\n]+"
KIMI_K2 = r"\p{Han}+"  # the trigger of unicode_regex_split_custom_kimi_k2 (it runs every K2 pattern)
AFMOE_DIGITS = r"\p{AFMoE_digits}"
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"  # llama.cpp runs it as unicode_regex_split_custom_afmoe

_M, _H = r"\xd4", r"\xd6"  # ACCENT_MARK; a Han character (the K2 splitter's collapsed text only)
_CONTRACTION_SUFFIX = r"(?:'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL]))?"
_CUSTOM = {
    GPT2: _CUSTOM_GPT2,
    LLAMA3: _custom_llama3("{1,3}"),
    QWEN2: _custom_llama3(""),
    # unicode_regex_split_custom_qwen35: qwen2's, with marks (\p{M}) in the letter runs and out of the symbols
    QWEN35: (
        rf"'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL])|[^\r\n{_L}{_N}]?[{_L}{_M}]+|[{_N}]"
        rf"| ?[^{_W}{_L}{_M}{_N}]+[\r\n]*|[{_W}]*[\r\n]+" + _WS_RUNS
    ),
    NEWLINES: r"[^\n]+|\n+",
    # unicode_regex_split_custom_kimi_k2: Han runs, non-Han letter runs with one optional leading non-letter and
    # a trailing contraction, numbers in threes, then llama3's symbol and whitespace rules (Han counts as a letter)
    KIMI_K2: (
        rf"[{_H}]+|[^\r\n{_L}{_N}{_H}]?[{_L}]+{_CONTRACTION_SUFFIX}|[{_N}]{{1,3}}"
        rf"| ?[^{_W}{_L}{_H}{_N}]+[\r\n]*|[{_W}]*[\r\n]+" + _WS_RUNS
    ),
}
_DIGIT_RUN = re.compile(rf"[{_N}]+")
_HAN = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # unicode_cpt_is_han


def _split_digit_groups(src: str, start: int, end: int) -> list[int]:
    """unicode_regex_split_custom_afmoe: each run of numbers as its leading len % 3 digits, then threes; what
    precedes a run joins its first group, what follows the last run is one piece."""
    out: list[int] = []
    prev = start
    for m in _DIGIT_RUN.finditer(src, start, end):
        lead = m.start() + (m.end() - m.start()) % 3
        for cut in ([lead] if lead > m.start() else []) + list(range(lead + 3, m.end() + 1, 3)):
            out.append(cut - prev)
            prev = cut
    if prev < end:
        out.append(end - prev)
    return out


_SPLITTERS = {AFMOE_DIGITS: _split_digit_groups, TINY_AYA_DIGITS: _split_digit_groups}

def _translate(expr: str) -> tuple[str, bool]:
    """A llama.cpp regex as a Python pattern, and whether it runs on the collapsed text (names categories)."""
    collapsed = _UCAT_RE.search(expr) is not None
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        escaped = i > 0 and expr[i - 1] == "\\"
        m = _UCAT_RE.match(expr, i) if collapsed else None
        if m:
            body = _UCAT_CLASS[_UCAT_NAMES[m.group(1)]]
            out.append(body if inside else f"[{body}]")
            i = m.end()
            continue
        if c == "[" and not escaped:
            inside = True
        elif c == "]" and inside and not escaped:
            inside = False
        elif c == "$" and not inside and not escaped:
            c = r"\Z"  # ECMAScript '$' is end of input only; Python's also matches before a final '\n'
        out.append(c)
        i += 1
    return "".join(out), collapsed


@dataclass(frozen=True, slots=True)
class _Stage:
    pattern: re.Pattern[str] | None
    splitter: Callable[[str, int, int], list[int]] | None  # a hand-written splitter that is not one pattern
    custom: bool  # a hand-written splitter: covers every character, no groups, no look-behind
    text: str  # "collapsed" (categories), "han" (collapsed, Han apart) or "wide" (non-ASCII whitespace -> 0x0B)


def _compile_stage(expr: str) -> _Stage:
    if expr in _SPLITTERS:
        return _Stage(None, _SPLITTERS[expr], custom=True, text="collapsed")
    if expr in _CUSTOM:
        return _Stage(re.compile(_CUSTOM[expr]), None, custom=True, text="han" if expr == KIMI_K2 else "collapsed")
    pattern, collapsed = _translate(expr)
    return _Stage(re.compile(pattern, re.ASCII), None, custom=False, text="collapsed" if collapsed else "wide")


class PreTokenizer:
    """`unicode_regex_split` for one list of regexes: `split(text)` returns the words (slices of text)."""

    def __init__(self, regex_exprs: tuple[str, ...]) -> None:
        self.regex_exprs = regex_exprs
        self._stages = [_compile_stage(e) for e in regex_exprs]
        self._collapse_table: dict[int, str] = {}
        self._han_table: dict[int, str] = {}
        self._wide_table = {c: _WHITESPACE_BYTE for c in _NON_ASCII_WHITESPACE}

    def _collapse(self, text: str, table: dict[int, str], han: bool) -> str:
        for ch in set(text):
            if ord(ch) >= 0x80 and ord(ch) not in table:
                is_han = han and any(lo <= ord(ch) <= hi for lo, hi in _HAN)
                table[ord(ch)] = "\xd6" if is_han else collapse_char(ch)
        return text.translate(table)

    def _source(self, text: str, kind: str) -> str:
        if kind == "collapsed":
            return self._collapse(text, self._collapse_table, False)
        if kind == "han":
            return self._collapse(text, self._han_table, True)
        return text.translate(self._wide_table)

    def split(self, text: str) -> list[str]:
        """Split `text` into pre-tokenizer words; concatenated they give `text` back."""
        if not text:
            return []
        lengths = [len(text)]
        if text.isascii():  # every kind of source text is the text itself
            for stage in self._stages:
                lengths = self._run_stage(stage, text, lengths)
        else:
            sources: dict[str, str] = {}
            for stage in self._stages:
                src = sources.get(stage.text)
                if src is None:
                    src = sources[stage.text] = self._source(text, stage.text)
                lengths = self._run_stage(stage, src, lengths)
        if 0 in lengths:  # a zero-length match is an empty word, which llama.cpp tokenizes to nothing
            lengths = [n for n in lengths if n]
        ends = list(accumulate(lengths))
        return [text[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    @staticmethod
    def _run_stage(stage: _Stage, src: str, lengths: list[int]) -> list[int]:
        # unicode_regex_split: each regex splits every piece of the previous one, never across pieces
        out: list[int] = []
        start = 0
        if stage.splitter is not None:
            for n in lengths:
                out += stage.splitter(src, start, start + n)
                start += n
        elif stage.custom:
            findall = stage.pattern.findall
            for n in lengths:
                out.extend(map(len, findall(src, start, start + n)))
                start += n
        else:
            for n in lengths:
                _split_stl(stage.pattern, src[start : start + n], out)
                start += n
        return out


def _split_stl(pattern: re.Pattern[str], piece: str, out: list[int]) -> None:
    # unicode_regex_split_stl: matches and the unmatched runs between them both become pieces. The piece is
    # sliced (not searched with pos/endpos) so that look-behind and \b see its ends as std::regex_iterator
    # does.
    prev = 0
    for m in pattern.finditer(piece):
        if m.start() > prev:
            out.append(m.start() - prev)
        out.append(m.end() - m.start())
        prev = m.end()
    if prev < len(piece):
        out.append(len(piece) - prev)
