"""The BPE pre-tokenizer types: `tokenizer.ggml.pre` -> its regexes and its tokenizer settings.

Two tables of src/llama-vocab.cpp: `llm_tokenizer_bpe::llm_tokenizer_bpe` (the regex_exprs of each
LLAMA_VOCAB_PRE_TYPE_*, and whether the words are byte-encoded GPT-2 style) and `llama_vocab::impl::load` (which
names select which type, and the clean_spaces / ignore_merges / add_bos / add_sep / escape_whitespaces each
sets). The regexes are copied as llama.cpp writes them; pretok.py runs them as `unicode_regex_split` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactx.vocab.pretok import (
    AFMOE_DIGITS,
    GPT2,
    KIMI_K2,
    LLAMA3,
    NEWLINES,
    QWEN2,
    QWEN35,
    TINY_AYA_DIGITS,
)

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_TAIL_SLASH = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"
_GPT4O_WORD = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_GPT4O_WORD2 = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_LM_WORD = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
_LM_WORD2 = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED_WORDS = (  # gpt-4o's tokenizer.json words, as llama.cpp writes them for youtu and tiny_aya
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    rf"{_CONTRACTIONS}?"
)
_DEEPSEEK3_WORDS = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+"
)
# the letter ranges as \u escapes: a copy of the characters would be NFC-normalized by editors (U+1F7D -> U+03CE)
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
    "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
    "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-"
    "\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0"
    "-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)

# llm_tokenizer_bpe::llm_tokenizer_bpe: regex family -> regex_exprs
REGEX_EXPRS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "jais2": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}",
    ),
    "deepseek-llm": (
        "[\r\n]",
        _DEEPSEEK_LLM_LETTERS,
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-퟿]+",
        "\\p{N}+",
    ),
    "deepseek3": (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_WORDS + "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
    "spark2_5": (
        r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_WORDS + "|[\r\n]|\\s+(?!\\S)|\\s+", r"\p{N}",
    ),
    "youtu": (
        "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
        _CASED_WORDS + r"|\p{N}" + _TAIL_SLASH,
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", GPT2),
    "gpt2": (GPT2,),
    "qwen2": (QWEN2,),
    "qwen35": (QWEN35,),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (_GPT4O_WORD + "|" + _GPT4O_WORD2 + r"|\p{N}" + _TAIL_SLASH,),
    "chameleon": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2,
    ),
    "gpt4o": (
        _GPT4O_WORD + _CONTRACTIONS + "?|" + _GPT4O_WORD2 + _CONTRACTIONS + r"?|\p{N}{1,3}" + _TAIL_SLASH,
    ),
    "granite-emb-multi": (
        _LM_WORD + _CONTRACTIONS + "?|" + _LM_WORD2 + _CONTRACTIONS + r"?|\p{N}{1,3}" + _TAIL_SLASH,
    ),
    "tiny_aya": (TINY_AYA_DIGITS, _CASED_WORDS + r"|\p{N}{1,3}" + _TAIL_SLASH),
    "kimi-k2": (KIMI_K2,),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL,),
    "afmoe": (
        AFMOE_DIGITS,
        "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (NEWLINES, QWEN2),
    "exaone-moe": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "newlines": (NEWLINES,),  # gemma4, sarvam-moe: SPM-style BPE, only newlines split the text
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+" + _TAIL),
    "whitespace": (r"\S+",),
}
# the families whose words stay raw UTF-8 (llm_tokenizer_bpe::byte_encode = false)
RAW_UTF8_FAMILIES = frozenset({"newlines", "whitespace"})


@dataclass(frozen=True, slots=True)
class PreType:
    """One LLAMA_VOCAB_PRE_TYPE_* as llama_vocab::impl::load sets it up for a BPE vocabulary."""

    name: str  # llama.cpp's enum name, lower case
    family: str  # a key of REGEX_EXPRS
    clean_spaces: bool = True  # a BPE vocabulary's default
    ignore_merges: bool = False
    add_bos: bool = False
    add_sep: bool = False
    escape_whitespaces: bool = False  # spaces become '▁' before splitting (SPM-style BPE)

    @property
    def byte_encode(self) -> bool:
        return self.family not in RAW_UTF8_FAMILIES


def _pre_types() -> dict[str, PreType]:
    # llama_vocab::impl::load: (pre type, family, settings, the tokenizer.ggml.pre names that select it)
    raw = "no-clean"
    groups: tuple[tuple[str, str, str, str], ...] = (
        ("default", "default", "", "default"),
        ("minicpm5", "minicpm5", "ignore", "minicpm5"),
        ("llama3", "llama3", "ignore bos", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 "
                                           "jina-v5-nano"),
        ("deepseek_llm", "deepseek-llm", raw, "deepseek-llm"),
        ("deepseek_coder", "deepseek-coder", raw, "deepseek-coder"),
        ("deepseek3_llm", "deepseek3", raw, "deepseek-v3"),
        ("spark2_5", "spark2_5", raw, "spark2_5"),
        ("youtu", "youtu", raw + " ignore", "youtu"),
        ("falcon", "falcon", "", "falcon"),
        ("mpt", "gpt2", "", "mpt"),
        ("starcoder", "starcoder", "", "starcoder"),
        ("gpt2", "gpt2", "", "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert"),
        ("jais2", "jais2", "", "jais-2"),
        ("gemma4", "newlines", "escape", "gemma4 granite-embed-multi-311m"),
        ("sarvam_moe", "newlines", raw + " escape", "sarvam-moe"),
        ("gpt2", "gpt2", "sep", "jina-v1-en jina-v2-code roberta-bpe"),
        ("whitespace", "whitespace", "", "whitespace"),
        ("refact", "starcoder", "", "refact"),
        ("command_r", "starcoder", raw, "command-r"),
        ("qwen2", "qwen2", raw, "qwen2 deepseek-r1-qwen kormo f2llmv2"),
        ("qwen35", "qwen35", raw, "qwen35"),
        ("stablelm2", "qwen2", "", "stablelm2"),
        ("olmo", "gpt2", "", "olmo"),
        ("dbrx", "llama3", "", "dbrx"),
        ("smaug", "llama3", "", "smaug-bpe"),
        ("poro", "bloom", raw, "poro-chat"),
        ("chatglm4", "llama3", "", "chatglm-bpe"),
        ("chatglm4", "llama3", "ignore", "glm4 glm5"),
        ("viking", "viking", raw, "viking"),
        ("jais", "gpt2", "", "jais"),
        ("tekken", "tekken", raw + " ignore bos", "tekken"),
        ("smollm", "starcoder", raw, "smollm"),
        ("codeshell", "starcoder", "", "codeshell"),
        ("bloom", "bloom", "", "bloom"),
        ("gpt3_finnish", "bloom", "", "gpt3-finnish"),
        ("exaone", "starcoder", "", "exaone"),
        ("gpt2", "gpt2", "", "exaone4"),
        ("exaone_moe", "exaone-moe", "", "exaone-moe"),
        ("chameleon", "chameleon", raw + " bos", "chameleon"),
        ("minerva", "starcoder", "", "minerva-7b"),
        ("qwen2", "qwen2", "", "megrez"),
        ("gpt4o", "gpt4o", raw, "gpt-4o llama4 kanana2 talkie"),
        ("granite_emb_multi", "granite-emb-multi", raw + " ignore", "granite-embed-multi-97m"),
        ("tiny_aya", "tiny_aya", raw, "tiny_aya cohere2moe"),
        ("superbpe", "superbpe", raw, "superbpe"),
        ("trillion", "gpt2", raw, "trillion"),
        ("granite_docling", "gpt2", raw, "granite-docling"),
        ("bailingmoe", "bailingmoe", raw, "bailingmoe bailingmoe2 llada-moe"),
        ("seed_coder", "seed-coder", raw, "seed-coder"),
        ("hunyuan", "qwen2", raw, "hunyuan"),
        ("hunyuan_dense", "deepseek3", raw, "hunyuan-dense"),
        ("hy_v4", "deepseek3", raw, "hy_v4"),
        ("joyai_llm", "deepseek3", raw, "joyai-llm"),
        ("kimi_k2", "kimi-k2", raw, "kimi-k2"),
        ("ufakzeka", "ufakzeka", raw, "ufakzeka"),
        ("grok_2", "qwen2", raw, "grok-2"),
        ("afmoe", "afmoe", raw, "afmoe"),
        ("laguna", "laguna", raw, "laguna"),
        ("minimax_m2", "gpt4o", raw, "minimax-m2"),
        ("solar_open", "qwen2", raw, "solar-open"),
        ("mellum2", "starcoder", "", "mellum2"),
    )
    out: dict[str, PreType] = {}
    for pre, family, settings, names in groups:
        s = settings.split()
        pre_type = PreType(pre, family, clean_spaces=raw not in s, ignore_merges="ignore" in s, add_bos="bos" in s,
                           add_sep="sep" in s, escape_whitespaces="escape" in s)
        out.update((name, pre_type) for name in names.split())
    return out


PRE_TYPES = _pre_types()
