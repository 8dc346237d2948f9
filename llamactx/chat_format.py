"""llama-cpp-python's `chat_format` prompt formats, for the names llama.cpp has no built-in template of.

llama-cpp-python counterpart: llama_cpp/llama_chat_format.py (0.3.36), its `@register_chat_format` formatters and
the `_format_*` styles they share, ported so that `Llama(chat_format=NAME)` renders the prompt llama-cpp-python
renders. Each format also has llama-cpp-python's stop string, if any. Like llama-cpp-python, a format always ends
with the assistant's turn opened (it has no add_generation_prompt), keeps only the roles its table names, and takes
the first system message as the system prompt. `CHAT_FORMATS` holds its 23 registered names; six of them (chatml,
gemma, zephyr, vicuna, openchat, chatglm3) are also llama.cpp built-in names with a different rendering, and
chat_template.py gives a bare name llama.cpp's meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

Turn = tuple[str, str | None]  # (role prefix, message); None opens the turn without a message
Msgs = Sequence[Mapping[str, Any]]


class ChatFormatted(NamedTuple):
    """llama_chat_format.ChatFormatterResponse: the prompt and the stop string the format adds (None: none)."""

    prompt: str
    stop: str | None = None


Formatter = Callable[[Msgs], ChatFormatted]


def _system_message(messages: Sequence[Mapping[str, Any]]) -> str:
    """_get_system_message: the first system message's content."""
    for m in messages:
        if m["role"] == "system":
            return m["content"] or ""
    return ""


def _map_roles(messages: Sequence[Mapping[str, Any]], role_map: Mapping[str, str]) -> list[Turn]:
    """_map_roles: the messages whose role the format names, with its prefix for that role."""
    return [(role_map[m["role"]], m["content"] if isinstance(m["content"], str) else None)
            for m in messages if m["role"] in role_map]


def _llama2_style(system: str, turns: list[Turn], sep: str, sep2: str) -> str:
    seps, out = (sep, sep2), system + sep
    for i, (role, message) in enumerate(turns):
        if system and i == 0:
            out += (message or "") + seps[i % 2]
        elif message:
            out += role + message + " " + seps[i % 2]
        else:
            out += role + " "
    return out


def _add_colon_single(system: str, turns: list[Turn], sep: str) -> str:
    return system + sep + "".join(f"{role}: {m}{sep}" if m else f"{role}:" for role, m in turns)


def _add_colon_two(system: str, turns: list[Turn], sep: str, sep2: str) -> str:
    seps = (sep, sep2)
    return system + sep + "".join(f"{role}: {m}{seps[i % 2]}" if m else f"{role}:"
                                  for i, (role, m) in enumerate(turns))


def _no_colon_single(system: str, turns: list[Turn], sep: str) -> str:
    return system + "".join(role + m + sep if m else role for role, m in turns)


def _add_colon_space_single(system: str, turns: list[Turn], sep: str) -> str:
    return system + sep + "".join(f"{role}: {m}{sep}" if m else f"{role}: " for role, m in turns)


def _chatml_style(system: str, turns: list[Turn], sep: str) -> str:
    head = "" if system == "" else system + sep + "\n"
    return head + "".join(f"{role}\n{m}{sep}\n" if m else f"{role}\n" for role, m in turns)


def _chatglm3_style(system: str, turns: list[Turn], sep: str) -> str:
    return system + "".join(f"{role}\n {m}" if m else role for role, m in turns)


def _open(messages: Msgs, roles: Mapping[str, str], assistant: str | None = None) -> list[Turn]:
    """The mapped turns plus the assistant's opened turn (most formats end this way)."""
    return [*_map_roles(messages, roles), (roles["assistant"] if assistant is None else assistant, None)]


def _llama_2(messages: Msgs) -> ChatFormatted:
    system = _system_message(messages)
    system = f"[INST] <<SYS>>\n{system}\n<</SYS>>" if system else ""
    turns = _map_roles(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})
    return ChatFormatted(_llama2_style(system, turns, " ", "</s>") + "[/INST]")


def _llama_3(messages: Msgs) -> ChatFormatted:
    roles = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}
    return ChatFormatted(_no_colon_single("", _open(messages, roles), "<|eot_id|>"), "<|eot_id|>")


def _alpaca(messages: Msgs) -> ChatFormatted:
    turns = _map_roles(messages, {"user": "### Instruction", "assistant": "### Response"})
    return ChatFormatted(_add_colon_two(_system_message(messages), turns, "\n\n", "</s>"))


def _qwen(messages: Msgs) -> ChatFormatted:
    system = "<|im_start|>system\n" + (_system_message(messages) or "You are a helpful assistant.")
    turns = _open(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    return ChatFormatted(_chatml_style(system, turns, "<|im_end|>"), "<|endoftext|>")


def _vicuna(messages: Msgs) -> ChatFormatted:
    system = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
              "detailed, and polite answers to the user's questions.")
    return ChatFormatted(_add_colon_two(system, _open(messages, {"user": "USER", "assistant": "ASSISTANT"}), " ",
                                        "</s>"))


def _oasst_llama(messages: Msgs) -> ChatFormatted:
    system = f"[INST] <<SYS>>\n{_system_message(messages)}\n<</SYS>>\n\n"
    turns = _open(messages, {"user": "<|prompter|>", "assistant": "<|assistant|>"})
    return ChatFormatted(_no_colon_single(system, turns, "</s>"))


def _baichuan(user: str, assistant: str) -> Formatter:
    def render(messages: Msgs) -> ChatFormatted:
        turns = _open(messages, {"user": user, "assistant": assistant})
        return ChatFormatted(_no_colon_single(_system_message(messages), turns, ""))
    return render


_OPENBUDDY_SYSTEM = """You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.
Always answer as helpfully and logically as possible, while being safe. Your answers should not include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive in nature.
If a question does not make any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't know the answer to a question, please don't share false information.
You can speak fluently in many languages, for example: English, Chinese.
You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.
You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.

"""  # noqa: E501 -- llama-cpp-python's text, verbatim


def _openbuddy(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "User", "assistant": "Assistant"})
    return ChatFormatted(_add_colon_single(_OPENBUDDY_SYSTEM, turns, "\n"))


def _redpajama_incite(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<human>", "assistant": "<bot>"})
    return ChatFormatted(_add_colon_single(_system_message(messages), turns, "\n"), "<human>")


def _snoozy(messages: Msgs) -> ChatFormatted:
    # llama-cpp-python builds an "### Instruction:" system text and then uses the bare system message instead
    system = _system_message(messages) or ("The prompt below is a question to answer, a task to complete, or a "
                                           "conversation to respond to; decide which and write an appropriate "
                                           "response.")
    turns = _open(messages, {"user": "### Prompt", "assistant": "### Response"})
    return ChatFormatted(_add_colon_single(system, turns, "\n"), "###")


def _phind(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "### User Message", "assistant": "### Assistant"})
    return ChatFormatted(_add_colon_single("### System Prompt\nYou are an intelligent programming assistant.", turns,
                                           "\n\n"))


def _intel(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "### User:", "assistant": "### Assistant:"})
    # the system text keeps its unfilled "{system_message}" placeholder, as llama-cpp-python's does
    return ChatFormatted(_add_colon_single("### System:\n{system_message}", turns, "\n"))


_OPEN_ORCA_SYSTEM = (
    "You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be sure you "
    "get the right answer. If you make a mistake or encounter an error in your thinking, say so out loud and attempt "
    "to correct it. If you don't know or aren't sure about something, say so clearly. You will act as a professional "
    "logician, mathematician, and physicist. You will also act as the most appropriate type of expert to answer any "
    "particular question or solve the relevant problem; state which expert type your are, if so. Also think of any "
    "particular named expert that would be ideal to answer the relevant question or solve the relevant problem; name "
    "and act as them, if appropriate."
)


def _open_orca(messages: Msgs) -> ChatFormatted:
    # its role map is {"User": "User", "Assistant": "Assistant"}: OpenAI's lower-case roles match none of it
    turns = [*_map_roles(messages, {"User": "User", "Assistant": "Assistant"}), ("Assistant", None)]
    return ChatFormatted(_add_colon_space_single(_OPEN_ORCA_SYSTEM, turns, "<|end_of_turn|>\n"), "User")


def _mistrallite(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"})
    return ChatFormatted(_no_colon_single(f"<|system|>{_system_message(messages)}</s>", turns, " "))


def _zephyr(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<|user|>\n", "assistant": "<|assistant|>\n"})
    return ChatFormatted(_chatml_style(f"<|system|>\n{_system_message(messages)}", turns, "</s>"), "</s>")


def _pygmalion(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<|user|>", "assistant": "<|model|>"})
    return ChatFormatted(_chatml_style(f"<|system|>{_system_message(messages)}", turns, "\n"), "\n")


def _chatml(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    return ChatFormatted(_chatml_style(f"<|im_start|>system\n{_system_message(messages)}", turns, "<|im_end|>"),
                         "<|im_end|>")


def _mistral_instruct(messages: Msgs) -> ChatFormatted:
    prompt = ""
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], str):
            prompt += "[INST] " + m["content"]
        elif m["role"] == "assistant" and m["content"] is not None:
            prompt += " [/INST]" + m["content"] + "</s>"
    return ChatFormatted(prompt + " [/INST]", "</s>")


def _chatglm3(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "<|user|>", "assistant": "<|assistant|>"})
    return ChatFormatted(_chatglm3_style(f"<|system|>\n{_system_message(messages)}", turns, "</s>"), "</s>")


def _openchat(messages: Msgs) -> ChatFormatted:
    turns = _open(messages, {"user": "GPT4 Correct User: ", "assistant": "<|end_of_turn|>GPT4 Correct Assistant: "})
    return ChatFormatted(_chatml_style(f"{_system_message(messages)}<|end_of_turn|>", turns, "<|end_of_turn|>"),
                         "<|end_of_turn|>")


def _saiga(messages: Msgs) -> ChatFormatted:
    turns = _map_roles(messages, {"user": "user", "bot": "bot", "system": "system"})
    prompt = "".join(f"<s>{role}\n{m}</s>" if m else f"<s>{role}\n" for role, m in turns)
    return ChatFormatted((prompt + "<s>bot").strip())


def _gemma(messages: Msgs) -> ChatFormatted:
    # system messages are not allowed on Gemma: llama-cpp-python drops them
    turns = _open(messages, {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"})
    return ChatFormatted(_no_colon_single("", turns, "<end_of_turn>\n"), "<end_of_turn>\n")


# name -> formatter(messages) -> ChatFormatted, llama_chat_format.py's register_chat_format names in its order
CHAT_FORMATS: dict[str, Formatter] = {
    "llama-2": _llama_2,
    "llama-3": _llama_3,
    "alpaca": _alpaca,
    "qwen": _qwen,
    "vicuna": _vicuna,
    "oasst_llama": _oasst_llama,
    "baichuan-2": _baichuan("<reserved_106>", "<reserved_107>"),
    "baichuan": _baichuan("<reserved_102>", "<reserved_103>"),
    "openbuddy": _openbuddy,
    "redpajama-incite": _redpajama_incite,
    "snoozy": _snoozy,
    "phind": _phind,
    "intel": _intel,
    "open-orca": _open_orca,
    "mistrallite": _mistrallite,
    "zephyr": _zephyr,
    "pygmalion": _pygmalion,
    "chatml": _chatml,
    "mistral-instruct": _mistral_instruct,
    "chatglm3": _chatglm3,
    "openchat": _openchat,
    "saiga": _saiga,
    "gemma": _gemma,
}


def format_chat(name: str, messages: Sequence[Mapping[str, Any]]) -> ChatFormatted:
    """The prompt and stop string of llama-cpp-python's chat format `name` for validated `messages` (each with a
    string `role` and `content`). Raises KeyError for a name that is not in CHAT_FORMATS."""
    return CHAT_FORMATS[name](messages)
