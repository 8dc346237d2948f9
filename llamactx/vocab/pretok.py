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
NEWLINES = r"[^\n]+|[\n]+"
_CUSTOM = {
    GPT2: _CUSTOM_GPT2,
    LLAMA3: _custom_llama3("{1,3}"),
    QWEN2: _custom_llama3(""),
    NEWLINES: r"[^\n]+|\n+",
}

_BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"
_GPT4O_WORD = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_GPT4O_WORD2 = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_GPT4O_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
REGEX_EXPRS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "gpt2": (GPT2,),
    "starcoder": (r"\p{N}", GPT2),
    "qwen2": (QWEN2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "deepseek3": (
        r"\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "tekken": (_GPT4O_WORD + "|" + _GPT4O_WORD2 + r"|\p{N}" + _GPT4O_TAIL,),
    "gpt4o": (
        _GPT4O_WORD + _CONTRACTIONS + "?|" + _GPT4O_WORD2 + _CONTRACTIONS + r"?|\p{N}{1,3}" + _GPT4O_TAIL,
    ),
    "laguna": (NEWLINES, QWEN2),
}


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
    pattern: re.Pattern[str]
    custom: bool  # a hand-written splitter: covers every character, no groups, no look-behind
    collapsed: bool  # runs on the collapsed text (else on the codepoints with non-ASCII whitespace -> 0x0B)


def _compile_stage(expr: str) -> _Stage:
    if expr in _CUSTOM:
        return _Stage(re.compile(_CUSTOM[expr]), custom=True, collapsed=True)
    pattern, collapsed = _translate(expr)
    return _Stage(re.compile(pattern, re.ASCII), custom=False, collapsed=collapsed)


class PreTokenizer:
    """`unicode_regex_split` for one list of regexes: `split(text)` returns the words (slices of text)."""

    def __init__(self, regex_exprs: tuple[str, ...]) -> None:
        self.regex_exprs = regex_exprs
        self._stages = [_compile_stage(e) for e in regex_exprs]
        self._collapse_table: dict[int, str] = {}
        self._wide_table = {c: _WHITESPACE_BYTE for c in _NON_ASCII_WHITESPACE}

    def _collapse(self, text: str) -> str:
        table = self._collapse_table
        for ch in set(text):
            if ord(ch) >= 0x80 and ord(ch) not in table:
                table[ord(ch)] = collapse_char(ch)
        return text.translate(table)

    def split(self, text: str) -> list[str]:
        """Split `text` into pre-tokenizer words; concatenated they give `text` back."""
        if not text:
            return []
        ascii_only = text.isascii()
        collapsed = text if ascii_only else self._collapse(text)
        wide = text if ascii_only else None
        lengths = [len(text)]
        for stage in self._stages:
            if not stage.collapsed and wide is None:
                wide = text.translate(self._wide_table)
            lengths = self._run_stage(stage, collapsed if stage.collapsed else wide, lengths)
        ends = list(accumulate(lengths))
        return [text[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    @staticmethod
    def _run_stage(stage: _Stage, src: str, lengths: list[int]) -> list[int]:
        # unicode_regex_split: each regex splits every piece of the previous one, never across pieces
        out: list[int] = []
        start = 0
        for n in lengths:
            end = start + n
            if stage.custom:
                out.extend(map(len, stage.pattern.findall(src, start, end)))
            else:
                _split_stl(stage.pattern, src[start:end], out)
            start = end
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


def _pre_types() -> dict[str, tuple[str, str, bool, bool, bool]]:
    # llama_vocab::impl::load: tokenizer.ggml.pre -> (pre_type, regex family, clean_spaces, ignore_merges,
    # add_bos)
    groups = (
        ("default", "default", True, False, False, "default"),
        (
            "llama3",
            "llama3",
            True,
            True,
            True,
            "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        ),
        ("dbrx", "llama3", True, False, False, "dbrx"),
        ("smaug", "llama3", True, False, False, "smaug-bpe"),
        ("chatglm4", "llama3", True, False, False, "chatglm-bpe"),
        ("chatglm4", "llama3", True, True, False, "glm4 glm5"),
        ("deepseek_coder", "deepseek-coder", False, False, False, "deepseek-coder"),
        ("deepseek3_llm", "deepseek3", False, False, False, "deepseek-v3"),
        ("hunyuan_dense", "deepseek3", False, False, False, "hunyuan-dense"),
        ("hy_v4", "deepseek3", False, False, False, "hy_v4"),
        ("joyai_llm", "deepseek3", False, False, False, "joyai-llm"),
        ("falcon", "falcon", True, False, False, "falcon"),
        ("mpt", "gpt2", True, False, False, "mpt"),
        ("starcoder", "starcoder", True, False, False, "starcoder"),
        (
            "gpt2",
            "gpt2",
            True,
            False,
            False,
            "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
            "jina-v1-en "
            "jina-v2-code roberta-bpe exaone4",
        ),
        ("refact", "starcoder", True, False, False, "refact"),
        ("command_r", "starcoder", False, False, False, "command-r"),
        ("qwen2", "qwen2", False, False, False, "qwen2 deepseek-r1-qwen kormo f2llmv2"),
        ("qwen2", "qwen2", True, False, False, "megrez"),
        ("stablelm2", "qwen2", True, False, False, "stablelm2"),
        ("olmo", "gpt2", True, False, False, "olmo"),
        ("poro", "bloom", False, False, False, "poro-chat"),
        ("bloom", "bloom", True, False, False, "bloom"),
        ("gpt3_finnish", "bloom", True, False, False, "gpt3-finnish"),
        ("viking", "viking", False, False, False, "viking"),
        ("jais", "gpt2", True, False, False, "jais"),
        ("tekken", "tekken", False, True, True, "tekken"),
        ("smollm", "starcoder", False, False, False, "smollm"),
        ("codeshell", "starcoder", True, False, False, "codeshell"),
        ("exaone", "starcoder", True, False, False, "exaone"),
        ("minerva", "starcoder", True, False, False, "minerva-7b"),
        ("mellum2", "starcoder", True, False, False, "mellum2"),
        ("gpt4o", "gpt4o", False, False, False, "gpt-4o llama4 kanana2 talkie"),
        ("minimax_m2", "gpt4o", False, False, False, "minimax-m2"),
        ("trillion", "gpt2", False, False, False, "trillion"),
        ("granite_docling", "gpt2", False, False, False, "granite-docling"),
        ("hunyuan", "qwen2", False, False, False, "hunyuan"),
        ("solar_open", "qwen2", False, False, False, "solar-open"),
        ("grok_2", "qwen2", False, False, False, "grok-2"),
        ("laguna", "laguna", False, False, False, "laguna"),
    )
    return {
        name: (pre, family, clean, ignore, bos)
        for pre, family, clean, ignore, bos, names in groups
        for name in names.split()
    }


PRE_TYPES = _pre_types()
