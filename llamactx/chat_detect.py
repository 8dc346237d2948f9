"""Which of llama.cpp's built-in chat template styles a template is, from its name or its Jinja source's markers.

llama.cpp counterpart: src/llama-chat.cpp llm_chat_detect_template (the checks in its order). llama.cpp renders a
template it detects with the built-in style instead of the Jinja (llama_chat_apply_template, and llama-server
without --jinja); llamactx always renders a Jinja source as Jinja and uses the detected style as the template's name.
"""

from __future__ import annotations

from llamactx.chat_builtin import LLM_CHAT_TEMPLATES


def _detect_mistral_or_llama2(tmpl: str) -> str:
    if "[SYSTEM_PROMPT]" in tmpl:
        return "mistral-v7"
    # the official v1, v3 and v3-tekken templates (mistralai/cookbook concept-deep-dive/tokenization)
    if "' [INST] ' + system_message" in tmpl or "[AVAILABLE_TOOLS]" in tmpl:
        if " [INST]" in tmpl:
            return "mistral-v1"
        return "mistral-v3-tekken" if '"[INST]"' in tmpl else "mistral-v3"
    # llama2 and its variants: system message support, BOS inside the history, stripped messages
    if "content.strip()" in tmpl:
        return "llama2-sys-strip"
    if "bos_token + '[INST]" in tmpl:
        return "llama2-sys-bos"
    return "llama2-sys" if "<<SYS>>" in tmpl else "llama2"


# (markers that must all be in the template, style), tried in llm_chat_detect_template's order after the
# branches with sub-cases (chatml-like, mistral / llama2, the <|assistant|> family, granite)
_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|assistant|>", "<|end|>"), "phi3"),
    (("[gMASK]<sop>",), "chatglm4"),
    (("<|assistant|>", "<|user|>"), "_assistant_user"),
    (("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (("<|user|>", "<|endoftext|>"), "zephyr"),
    (("bos_token + message['role']",), "monarch"),
    (("<start_of_turn>",), "gemma"),
    (("'\\n\\nAssistant: ' + eos_token",), "orion"),
    (("GPT4 Correct ",), "openchat"),
    (("USER: ", "ASSISTANT: "), "_vicuna"),
    (("### Instruction:", "<|EOT|>"), "deepseek"),
    (("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (("[gMASK]sop",), "chatglm3"),
    (("<用户>",), "minicpm"),
    (("'Assistant: ' + message['content'] + eos_token",), "deepseek2"),
    (("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
    (("[|system|]", "[|assistant|]", "[|endofturn|]"), "_exaone"),
    (("rwkv-world",), "rwkv-world"),
    (("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",), "rwkv-world"),
    (("<|start_of_role|>",), "_granite"),
    (("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",),
     "gigachat"),
    (("<|role_start|>",), "megrez"),
    ((" Ассистент:",), "yandex"),
    (("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (("<|header_start|>", "<|header_end|>"), "llama4"),
    (("<|endofuserprompt|>",), "dots1"),
    (("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (("<|start|>", "<|channel|>"), "gpt-oss"),
    (("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (("<|im_assistant|>assistant<|im_middle|>",), "kimi-k2"),
    (("<seed:bos>",), "seed_oss"),
    (("'Assistant: '  + message['content'] + '<|separator|>",), "grok-2"),
    (("[unused9]系统：[unused10]",), "pangu-embedded"),
    (("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
)


def _refine(style: str, tmpl: str) -> str:
    """The sub-cases of the detection branches marked with a leading underscore."""
    if style == "_assistant_user":
        if "<|tool_declare|>" in tmpl:
            return "exaone-moe"
        return "falcon3" if "</s>" in tmpl else "glmedge"
    if style == "_vicuna":  # eachadea/vicuna-13b-1.1 and its Orca variant
        return "vicuna-orca" if "SYSTEM: " in tmpl else "vicuna"
    if style == "_exaone":
        return "exaone4" if "[|tool|]" in tmpl else "exaone3"
    if style == "_granite":
        if "<tool_call>" in tmpl or "<tools>" in tmpl:
            return "granite-4.0" if "g4_default_system_message" in tmpl else "granite-4.1"
        return "granite"
    return style


def detect_builtin(tmpl: str) -> str | None:
    """The built-in style for `tmpl`: itself when it is a built-in name, else the style its markers point to
    (llm_chat_detect_template's checks, in its order), None when none matches (LLM_CHAT_TEMPLATE_UNKNOWN).
    May return "dots1", a style llama.cpp detects but gives no name."""
    if tmpl in LLM_CHAT_TEMPLATES:
        return tmpl
    if "<|im_start|>" in tmpl:
        if "<|im_sep|>" in tmpl:
            return "phi4"
        # SmolVLM uses <|im_start|> as its BOS, but is not chatml
        return "smolvlm" if "<end_of_utterance>" in tmpl else "chatml"
    if tmpl.startswith("mistral") or "[INST]" in tmpl:
        return _detect_mistral_or_llama2(tmpl)
    for markers, style in _MARKERS:
        if all(m in tmpl for m in markers):
            return _refine(style, tmpl)
    return None
