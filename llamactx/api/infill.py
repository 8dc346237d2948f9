"""Fill-in-the-middle prompts for POST /infill (llama-server's handle_infill and server-common.cpp
`format_prompt_infill`: the repo-level FIM pattern, https://arxiv.org/pdf/2409.12186).

    [FIM_REP]myproject
    [FIM_SEP]filename0
    extra chunk 0
    ...
    [FIM_SEP]filename
    [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]prompt

The prefix keeps its last 3/4 of a batch, the suffix its first 1/4 (less the prompt), the extra chunks fill what
the slot's context has left (their end kept), as llama-server does.
"""

from __future__ import annotations

from typing import Any

from llamactx.api.protocol import ProtocolError
from llamactx.vocab import TOKEN_NULL

# "\n\n--- snippet ---\n\n": llama-server's chunk separator for models without a FIM file separator
_SNIPPET = "\n\n--- snippet ---\n\n"


def check_supported(vocab) -> None:
    """A 400 naming the FIM tokens the model lacks."""
    missing = [name for name, tok in (("prefix", vocab.fim_pre), ("suffix", vocab.fim_suf),
                                      ("middle", vocab.fim_mid)) if tok == TOKEN_NULL]
    if missing:
        raise ProtocolError(f"Infill is not supported by this model: {', '.join(missing)} token(s) missing",
                            400, "not_supported_error")


def parse(body: dict[str, Any]) -> tuple[Any, Any, list[dict[str, str]], str]:
    """(input_prefix, input_suffix, input_extra, prompt) from a request body; ProtocolError names a bad field."""
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise ProtocolError(f'"{name}" is required')
        value = body[name]
        if not (isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(v, (str, int)) and not isinstance(v, bool) for v in value))):
            raise ProtocolError(f"{name} must be a string or a list of strings and token ids")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise ProtocolError('"prompt" must be a string')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise ProtocolError('"input_extra" must be an array of {"filename": string, "text": string}')
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ProtocolError(f'input_extra[{i}] must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ProtocolError(f'input_extra[{i}].filename must be a string')
    return body["input_prefix"], body["input_suffix"], extra, prompt


def _mixed(vocab, value) -> list[int]:
    """tokenize_mixed: text, or a list of texts and token ids, without special tokens."""
    if isinstance(value, str):
        return vocab.tokenize(value, add_special=False, parse_special=False)
    out: list[int] = []
    for v in value:
        if isinstance(v, str):
            out += vocab.tokenize(v, add_special=False, parse_special=False)
        elif not 0 <= v < vocab.n_tokens:
            raise ProtocolError(f"token {v} is outside the vocab [0, {vocab.n_tokens})")
        else:
            out.append(v)
    return out


def format_infill(vocab, prefix, suffix, extra: list[dict[str, str]], n_batch: int, n_predict: int, n_ctx: int,
                  prompt_tokens: list[int], spm_infill: bool = False) -> list[int]:
    """The FIM prompt's tokens (format_prompt_infill)."""
    def tok(text: str) -> list[int]:
        return vocab.tokenize(text, add_special=False, parse_special=False)

    tokens_prefix, tokens_suffix = _mixed(vocab, prefix), _mixed(vocab, suffix)
    extra_tokens: list[int] = []
    if vocab.fim_rep != TOKEN_NULL:
        extra_tokens += [vocab.fim_rep, *tok("myproject\n")]
    for chunk in extra:
        if vocab.fim_sep != TOKEN_NULL:
            extra_tokens += [vocab.fim_sep, *tok(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += tok(_SNIPPET)
        extra_tokens += tok(chunk["text"])
    if vocab.fim_sep != TOKEN_NULL:
        extra_tokens += [vocab.fim_sep, *tok("filename\n")]
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    tokens_prefix = [vocab.fim_pre, *tokens_prefix[len(tokens_prefix) - n_prefix_take :], *prompt_tokens]
    tokens_suffix = [vocab.fim_suf, *tokens_suffix[:n_suffix_take]]
    inp, end = (tokens_suffix, tokens_prefix) if spm_infill else (tokens_prefix, tokens_suffix)
    if vocab.add_bos:
        inp = [vocab.bos, *inp]
    inp = extra_tokens[len(extra_tokens) - n_extra_take :] + inp  # the extra context before the FIM prefix
    return [*inp, *end, vocab.fim_mid]
