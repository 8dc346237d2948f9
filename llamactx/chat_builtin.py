"""llama.cpp's built-in chat templates: named prompt formats rendered in code, not Jinja.

llama.cpp counterpart: src/llama-chat.cpp. `LLM_CHAT_TEMPLATES` is its name table (the names
`llama_chat_builtin_templates` lists and `--chat-template NAME` accepts) and `apply_builtin` is
`llm_chat_apply_template`: one renderer per style, each a port of its C++ branch, so that a name renders byte for byte
the prompt `llama_chat_apply_template(name, ...)` returns. The renderers see (role, content) pairs only, as the C API
does: no tools, no BOS/EOS variables (a style that wants "<s>" writes it literally). Which style a Jinja source is
(llm_chat_detect_template) is chat_detect.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

Message = tuple[str, str]  # (role, content): llama.h's llama_chat_message
Renderer = Callable[[Sequence[Message], bool], str]  # (chat, add_ass) -> prompt

_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


def _trim(s: str) -> str:
    """llama-chat.cpp trim(): ASCII whitespace only, as isspace() on the UTF-8 bytes."""
    return s.strip(_SPACE)


def _ascii_upper(s: str) -> str:
    """toupper() byte by byte: only a-z change."""
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def _chatml(chat: Sequence[Message], add_ass: bool) -> str:
    out = [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in chat]
    return "".join(out) + ("<|im_start|>assistant\n" if add_ass else "")


def _mistral_v7(chat: Sequence[Message], add_ass: bool, *, space: str) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"[SYSTEM_PROMPT]{space}{content}[/SYSTEM_PROMPT]")
        elif role == "user":
            out.append(f"[INST]{space}{content}[/INST]")
        else:
            out.append(f"{space}{content}</s>")
    return "".join(out)


def _mistral_v1_v3(chat: Sequence[Message], add_ass: bool, *, leading: str, trailing: str, trim: bool) -> str:
    out, inside_turn = [], False
    for role, content in chat:
        if not inside_turn:
            out.append(f"{leading}[INST]{trailing}")
            inside_turn = True
        if role == "system":
            out.append(content + "\n\n")
        elif role == "user":
            out.append(f"{content}{leading}[/INST]")
        else:
            out.append(f"{trailing}{_trim(content) if trim else content}</s>")
            inside_turn = False
    return "".join(out)


def _llama2(chat: Sequence[Message], add_ass: bool, *, system: bool, bos_inside: bool, strip: bool) -> str:
    out, inside_turn = ["[INST] "], True  # the first turn opens without BOS
    for role, content in chat:
        content = _trim(content) if strip else content
        if not inside_turn:
            inside_turn = True
            out.append("<s>[INST] " if bos_inside else "[INST] ")
        if role == "system":
            # without <<SYS>> support the system text still goes into the first turn
            out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n")
        elif role == "user":
            out.append(content + " [/INST]")
        else:
            out.append(content + "</s>")
            inside_turn = False
    return "".join(out)


def _turns(chat: Sequence[Message], add_ass: bool, *, fmt: str, gen: str, trim: bool = False, head: str = "") -> str:
    """The styles that write every message the same way: `head`, then `fmt` with {role} and {content} per message,
    then `gen` when the assistant's turn is asked for."""
    out = [fmt.format(role=role, content=_trim(content) if trim else content) for role, content in chat]
    return head + "".join(out) + (gen if add_ass else "")


def _monarch(chat: Sequence[Message], add_ass: bool) -> str:
    out = [f"{'' if i == 0 else '<s>'}{role}\n{content}</s>\n" for i, (role, content) in enumerate(chat)]
    return "".join(out) + ("<s>assistant\n" if add_ass else "")


def _gemma(chat: Sequence[Message], add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":  # no system role: merged into the next user turn
            system += _trim(content)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(content) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_ass else "")


def _orion(chat: Sequence[Message], add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += content
        elif role == "user":
            out.append("Human: ")
            if system:
                out.append(system + "\n\n")
                system = ""
            out.append(content + "\n\nAssistant: </s>")
        else:
            out.append(content + "</s>")
    return "".join(out)


def _openchat(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(content + "<|end_of_turn|>")
        else:
            out.append(f"GPT4 Correct {_ascii_upper(role[:1])}{role[1:]}: {content}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add_ass else "")


def _vicuna(chat: Sequence[Message], add_ass: bool, *, orca: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"SYSTEM: {content}\n" if orca else content + "\n\n")
        elif role == "user":
            out.append(f"USER: {content}\n")
        elif role == "assistant":
            out.append(f"ASSISTANT: {content}</s>\n")
    return "".join(out) + ("ASSISTANT:" if add_ass else "")


def _by_role(chat: Sequence[Message], add_ass: bool, *, roles: dict[str, str], gen: str, trim: bool = False,
             head: str = "") -> str:
    """The styles with one format per known role (other roles are dropped): `roles[role]` with {content}."""
    out = [head]
    for role, content in chat:
        if role in roles:
            out.append(roles[role].format(content=_trim(content) if trim else content))
    return "".join(out) + (gen if add_ass else "")


def _minicpm(chat: Sequence[Message], add_ass: bool) -> str:
    return "".join(f"<用户>{_trim(c)}<AI>" if role == "user" else _trim(c) for role, c in chat)


def _rwkv_world(chat: Sequence[Message], add_ass: bool) -> str:
    out = []  # the model has "\n\n" as its end-of-turn token
    for i, (role, content) in enumerate(chat):
        if role == "system":
            out.append(f"System: {_trim(content)}\n\n")
        elif role == "user":
            out.append(f"User: {_trim(content)}\n\n")
            if i == len(chat) - 1:
                out.append("Assistant:")
        elif role == "assistant":
            out.append(f"Assistant: {_trim(content)}\n\n")
    return "".join(out)


def _granite_3(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        call = "<|tool_call|>" if role == "assistant_tool_call" else ""
        out.append(f"<|start_of_role|>{role}<|end_of_role|>{call}{content}<|end_of_text|>\n")
    return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")


def _granite_4(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "assistant_tool_call":
            out.append("<|start_of_role|>assistant<|end_of_role|><|tool_call|>")
        else:
            out.append(f"<|start_of_role|>{role}<|end_of_role|>")
        out.append(content + "<|end_of_text|>\n")
    return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")


def _gigachat(chat: Sequence[Message], add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = [f"<s>{chat[0][1]}<|message_sep|>" if has_system else "<s>"]
    for role, content in chat[1 if has_system else 0 :]:
        if role == "user":
            out.append(f"user<|role_sep|>{content}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>")
        elif role == "assistant":
            out.append(f"assistant<|role_sep|>{content}<|message_sep|>")
    return "".join(out) + ("assistant<|role_sep|>" if add_ass else "")


def _yandex(chat: Sequence[Message], add_ass: bool) -> str:
    roles = {"user": " Пользователь: {content}\n\n", "assistant": " Ассистент: {content}\n\n"}
    return _by_role(chat, add_ass, roles=roles, gen=" Ассистент:[SEP]")


def _bailing(chat: Sequence[Message], add_ass: bool, *, think: bool) -> str:
    out = [f"<role>{'HUMAN' if role == 'user' else _ascii_upper(role)}</role>{content}" for role, content in chat]
    return "".join(out) + (("<role>ASSISTANT</role>" + ("<think>" if think else "")) if add_ass else "")


def _bailing2(chat: Sequence[Message], add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = [] if has_system else ["<role>SYSTEM</role>detailed thinking off<|role_end|>"]
    for role, content in chat:
        out.append(f"<role>{'HUMAN' if role == 'user' else _ascii_upper(role)}</role>{content}<|role_end|>")
    return "".join(out) + ("<role>ASSISTANT</role>" if add_ass else "")


def _smolvlm(chat: Sequence[Message], add_ass: bool) -> str:
    out = ["<|im_start|>"]  # <|im_start|> is its BOS; the turns are not chatml
    for role, content in chat:
        if role == "system":
            out.append(content + "\n\n")
        elif role == "user":
            out.append(f"User: {content}<end_of_utterance>\n")
        else:
            out.append(f"Assistant: {content}<end_of_utterance>\n")
    return "".join(out) + ("Assistant:" if add_ass else "")


def _dots1(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"<|system|>{content}<|endofsystem|>")
        elif role == "user":
            out.append(f"<|userprompt|>{content}<|endofuserprompt|>")
        else:
            out.append(f"<|response|>{content}<|endofresponse|>")
    return "".join(out) + ("<|response|>" if add_ass else "")


def _hunyuan_moe(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for role, content in chat:
        if role == "system":
            out.append(f"<|startoftext|>{content}<|extra_4|>")
        elif role == "assistant":
            out.append(content + "<|eos|>")
        else:
            out.append(f"<|startoftext|>{content}<|extra_0|>")
    return "".join(out)


def _openai_moe(chat: Sequence[Message], add_ass: bool) -> str:
    out = [f"<|start|>{role}<|message|>{content}{'<|return|>' if role == 'assistant' else '<|end|>'}"
           for role, content in chat]
    return "".join(out) + ("<|start|>assistant" if add_ass else "")


def _hunyuan_dense(chat: Sequence[Message], add_ass: bool) -> str:
    out = []
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        if role == "assistant":
            out.append(f"<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>")
        elif role == "user":
            out.append(f"<｜hy_User｜>{content}<｜hy_Assistant｜>")
    return "".join(out)


def _hunyuan_vl(chat: Sequence[Message], add_ass: bool) -> str:
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out.append(content + "<｜hy_place▁holder▁no▁3｜>")
        elif role == "user":
            out.append(content + "<｜hy_User｜>")
        elif role == "assistant":
            out.append(content + "<｜hy_Assistant｜>")
    return "".join(out)


def _kimi_k2(chat: Sequence[Message], add_ass: bool) -> str:
    heads = {"system": "<|im_system|>system<|im_middle|>", "user": "<|im_user|>user<|im_middle|>",
             "assistant": "<|im_assistant|>assistant<|im_middle|>", "tool": "<|im_system|>tool<|im_middle|>"}
    out = [f"{heads.get(role, '')}{content}<|im_end|>" for role, content in chat]
    return "".join(out) + ("<|im_assistant|>assistant<|im_middle|>" if add_ass else "")


def _seed_oss(chat: Sequence[Message], add_ass: bool) -> str:
    out = [f"<seed:bos>{role}\n{_trim(content) if role == 'assistant' else content}<seed:eos>"
           for role, content in chat]
    return "".join(out) + ("<seed:bos>assistant\n" if add_ass else "")


def _grok2(chat: Sequence[Message], add_ass: bool) -> str:
    out = []  # system and user turns trimmed, the assistant's not
    for role, content in chat:
        if role == "system":
            out.append(f"System: {_trim(content)}<|separator|>\n\n")
        elif role == "user":
            out.append(f"Human: {_trim(content)}<|separator|>\n\n")
        elif role == "assistant":
            out.append(f"Assistant: {content}<|separator|>\n\n")
    return "".join(out) + ("Assistant:" if add_ass else "")


def _pangu_embed(chat: Sequence[Message], add_ass: bool) -> str:
    names = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}
    out = []
    for i, (role, content) in enumerate(chat):
        if i == 0 and role != "system":
            out.append("[unused9]系统：[unused10]")
        if role in names:
            out.append(f"[unused9]{names[role]}：{content}[unused10]")
    return "".join(out) + ("[unused9]助手：" if add_ass else "")


_EXAONE_3 = {"system": "[|system|]{content}[|endofturn|]\n", "user": "[|user|]{content}\n",
             "assistant": "[|assistant|]{content}[|endofturn|]\n"}
_COMMAND_R = {role: f"<|START_OF_TURN_TOKEN|><|{token}_TOKEN|>{{content}}<|END_OF_TURN_TOKEN|>"
              for role, token in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))}
_DEEPSEEK_3 = {"system": "{content}\n\n", "user": "<｜User｜>{content}",
               "assistant": "<｜Assistant｜>{content}<｜end▁of▁sentence｜>"}

# style -> renderer; the styles are llama.cpp's names, plus "dots1", which it detects but has no name for
_STYLES: dict[str, Renderer] = {
    "chatml": _chatml,
    "llama2": partial(_llama2, system=False, bos_inside=False, strip=False),
    "llama2-sys": partial(_llama2, system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": partial(_llama2, system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": partial(_llama2, system=True, bos_inside=False, strip=True),
    "mistral-v1": partial(_mistral_v1_v3, leading=" ", trailing=" ", trim=False),
    "mistral-v3": partial(_mistral_v1_v3, leading="", trailing=" ", trim=True),
    "mistral-v3-tekken": partial(_mistral_v1_v3, leading="", trailing="", trim=False),
    "mistral-v7": partial(_mistral_v7, space=" "),
    "mistral-v7-tekken": partial(_mistral_v7, space=""),
    "phi3": partial(_turns, fmt="<|{role}|>\n{content}<|end|>\n", gen="<|assistant|>\n"),
    "phi4": partial(_turns, fmt="<|im_start|>{role}<|im_sep|>{content}<|im_end|>",
                    gen="<|im_start|>assistant<|im_sep|>"),
    "falcon3": partial(_turns, fmt="<|{role}|>\n{content}\n", gen="<|assistant|>\n"),
    "zephyr": partial(_turns, fmt="<|{role}|>\n{content}<|endoftext|>\n", gen="<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": partial(_vicuna, orca=False),
    "vicuna-orca": partial(_vicuna, orca=True),
    "deepseek": partial(_by_role, roles={"system": "{content}", "user": "### Instruction:\n{content}\n",
                                         "assistant": "### Response:\n{content}\n<|EOT|>\n"}, gen="### Response:\n"),
    "deepseek2": partial(_by_role, roles={"system": "{content}\n\n", "user": "User: {content}\n\n",
                                          "assistant": "Assistant: {content}<｜end▁of▁sentence｜>"}, gen="Assistant:"),
    "deepseek3": partial(_by_role, roles=_DEEPSEEK_3, gen="<｜Assistant｜>"),
    "deepseek-ocr": lambda chat, add_ass: "".join(content for _, content in chat),  # no template
    "command-r": partial(_by_role, roles=_COMMAND_R, gen="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=True),
    "llama3": partial(_turns, fmt="<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                      gen="<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True),
    "chatglm3": partial(_turns, fmt="<|{role}|>\n {content}", gen="<|assistant|>", head="[gMASK]sop"),
    "chatglm4": partial(_turns, fmt="<|{role}|>\n{content}", gen="<|assistant|>\n", head="[gMASK]<sop>"),
    "glmedge": partial(_turns, fmt="<|{role}|>\n{content}", gen="<|assistant|>"),
    "minicpm": _minicpm,
    "exaone3": partial(_by_role, roles=_EXAONE_3, gen="[|assistant|]", trim=True),
    "exaone4": partial(_by_role, roles={**_EXAONE_3, "tool": "[|tool|]{content}[|endofturn|]\n"}, gen="[|assistant|]",
                       trim=True),
    "exaone-moe": partial(_by_role, roles={r: f"<|{r}|>\n{{content}}<|endofturn|>\n"
                                           for r in ("system", "user", "assistant", "tool")},
                          gen="<|assistant|>\n", trim=True),
    "rwkv-world": _rwkv_world,
    "granite": _granite_3,
    "granite-4.0": _granite_4,
    "granite-4.1": _granite_4,
    "gigachat": _gigachat,
    "megrez": partial(_turns, fmt="<|role_start|>{role}<|role_end|>{content}<|turn_end|>",
                      gen="<|role_start|>assistant<|role_end|>"),
    "yandex": _yandex,
    "bailing": partial(_bailing, think=False),
    "bailing-think": partial(_bailing, think=True),
    "bailing2": _bailing2,
    "llama4": partial(_turns, fmt="<|header_start|>{role}<|header_end|>\n\n{content}<|eot|>",
                      gen="<|header_start|>assistant<|header_end|>\n\n", trim=True),
    "smolvlm": _smolvlm,
    "dots1": _dots1,
    "hunyuan-moe": _hunyuan_moe,
    "gpt-oss": _openai_moe,
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-vl": _hunyuan_vl,
    "kimi-k2": _kimi_k2,
    "seed_oss": _seed_oss,
    "grok-2": _grok2,
    "pangu-embedded": _pangu_embed,
    "solar-open": partial(_turns, fmt="<|begin|>{role}<|content|>{content}<|end|>", gen="<|begin|>assistant"),
}

# llama-chat.cpp LLM_CHAT_TEMPLATES: the built-in names, in its (std::map, sorted) order
LLM_CHAT_TEMPLATES: tuple[str, ...] = tuple(sorted(s for s in _STYLES if s != "dots1"))


def apply_builtin(style: str, chat: Sequence[Message], add_ass: bool) -> str:
    """The prompt of built-in `style` (a name of LLM_CHAT_TEMPLATES, or a style detect_builtin returned) for
    `chat`'s (role, content) pairs, as llm_chat_apply_template writes it. Raises KeyError for an unknown style."""
    return _STYLES[style](chat, add_ass)
