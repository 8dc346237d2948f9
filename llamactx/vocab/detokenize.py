"""The byte-level parts of detokenizing (src/llama-vocab.cpp): llama_decode_text, which turns a byte-level BPE
token text back into bytes through GPT-2's byte-to-unicode map (unicode_utf8_to_byte_map), and the three
clean_spaces passes of llama_vocab::impl::detokenize.
"""

from __future__ import annotations


def _byte_decoder() -> dict[str, int]:
    # unicode_utf8_to_byte_map: GPT-2's printable stand-ins for the 256 bytes
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in keep]
    return {**{chr(b): b for b in keep}, **{chr(256 + n): b for n, b in enumerate(extra)}}


def decode_byte_level(text: str) -> bytes:
    """llama_decode_text: a byte-level BPE token text back to its bytes."""
    # each character back to its byte; characters outside the map become llama.cpp's marker
    table = _BYTE_DECODER
    out = bytearray()
    for ch in text:
        b = table.get(ch)
        if b is None:
            marker = f"[UNK_BYTE_0x{ch.encode('utf-8', 'surrogateescape').hex()}{text}]"
            out += marker.encode("utf-8", "surrogateescape")
        else:
            out.append(b)
    return bytes(out)


_BYTE_DECODER = _byte_decoder()


def clean_spaces(text: bytes) -> bytes:
    """llama_vocab::impl::detokenize's clean_spaces (clean_up_tokenization_spaces)."""
    # the same three in-place passes over the bytes
    buf = bytearray(text)
    total = len(buf)
    for rule in (_pass_punct, _pass_quote, _pass_contraction):
        total = rule(buf, total)
    return bytes(buf[:total])


def _pass_punct(buf: bytearray, n: int) -> int:
    # " ?", " !", " .", " ," lose the space
    total = 1 if n else 0
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    return total


def _pass_quote(buf: bytearray, n: int) -> int:
    # " ' " loses both spaces
    total = 1 if n else 0
    i = 1
    while i < n:
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    return total


def _pass_contraction(buf: bytearray, n: int) -> int:
    # " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it)
    total = 1 if n else 0
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                total -= 1
            elif i + 2 < n and (x1, buf[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                total -= 1
        buf[total] = x
        total += 1
    return total
