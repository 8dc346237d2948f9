"""llama-cpp-python's llama_tokenizer: the tokenizer interface `Llama(tokenizer=...)` takes and the model's own
(llamactx.llama_cpp_options.LlamaTokenizer, on llamactx.vocab); LlamaHFTokenizer wraps a `transformers` one."""

from __future__ import annotations

from typing import Any

from llamactx.llama_cpp_options import BaseLlamaTokenizer, LlamaTokenizer


class LlamaHFTokenizer(BaseLlamaTokenizer):
    """A Hugging Face tokenizer (anything with encode/decode) behind the interface."""

    def __init__(self, hf_tokenizer: Any):
        self.hf_tokenizer = hf_tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.hf_tokenizer.encode(text.decode("utf-8", errors="ignore"), add_special_tokens=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        skip = not special
        if prev_tokens is not None:
            text = self.hf_tokenizer.decode(prev_tokens + tokens, skip_special_tokens=skip).encode("utf-8", "ignore")
            prev = self.hf_tokenizer.decode(prev_tokens, skip_special_tokens=skip).encode("utf-8", "ignore")
            return text[len(prev):]
        return self.hf_tokenizer.decode(tokens, skip_special_tokens=skip).encode("utf-8", errors="ignore")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> LlamaHFTokenizer:
        from transformers import AutoTokenizer  # not a llamactx dependency: install transformers for this

        return cls(AutoTokenizer.from_pretrained(pretrained_model_name_or_path))


__all__ = ["BaseLlamaTokenizer", "LlamaHFTokenizer", "LlamaTokenizer"]
