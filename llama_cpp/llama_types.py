"""llama-cpp-python's llama_types: the OpenAI request and response shapes as TypedDicts (llama_cpp/llama_types.py
of 0.3.36), for type hints and for building messages (`ChatCompletionRequestUserMessage(role="user", ...)`). The
dicts llamactx returns have these shapes (llamactx.api.responses renders them)."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union  # noqa: UP035 -- the names it re-exports

JsonType = Union[None, int, str, bool, List[Any], Dict[str, Any]]  # noqa: UP006,UP007


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embedding(TypedDict):
    index: int
    object: str
    embedding: List[float] | List[List[float]]  # noqa: UP006


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: List[Embedding]  # noqa: UP006
    usage: EmbeddingUsage


class CompletionLogprobs(TypedDict):
    text_offset: List[int]  # noqa: UP006
    token_logprobs: List[Optional[float]]  # noqa: UP006,UP045
    tokens: List[str]  # noqa: UP006
    top_logprobs: List[Optional[Dict[str, float]]]  # noqa: UP006,UP045


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: Optional[CompletionLogprobs]  # noqa: UP045
    finish_reason: Optional[Literal["stop", "length"]]  # noqa: UP045


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CreateCompletionResponse(TypedDict, total=False):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: List[CompletionChoice]  # noqa: UP006
    usage: CompletionUsage


class ChatCompletionResponseFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionMessageToolCallFunction


ChatCompletionMessageToolCalls = List[ChatCompletionMessageToolCall]  # noqa: UP006


class ChatCompletionResponseMessage(TypedDict, total=False):
    content: Optional[str]  # noqa: UP045
    tool_calls: ChatCompletionMessageToolCalls
    role: Literal["assistant", "function"]
    function_call: ChatCompletionResponseFunctionCall


class ChatCompletionFunction(TypedDict, total=False):
    name: str
    description: str
    parameters: Dict[str, JsonType]  # noqa: UP006


class ChatCompletionTopLogprobToken(TypedDict):
    token: str
    logprob: float
    bytes: Optional[List[int]]  # noqa: UP006,UP045


class ChatCompletionLogprobToken(ChatCompletionTopLogprobToken):
    top_logprobs: List[ChatCompletionTopLogprobToken]  # noqa: UP006


class ChatCompletionLogprobs(TypedDict):
    content: Optional[List[ChatCompletionLogprobToken]]  # noqa: UP006,UP045
    refusal: Optional[List[ChatCompletionLogprobToken]]  # noqa: UP006,UP045


class ChatCompletionResponseChoice(TypedDict):
    index: int
    message: ChatCompletionResponseMessage
    logprobs: Optional[ChatCompletionLogprobs]  # noqa: UP045
    finish_reason: Optional[str]  # noqa: UP045


class CreateChatCompletionResponse(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: List[ChatCompletionResponseChoice]  # noqa: UP006
    usage: CompletionUsage


class ChatCompletionMessageToolCallChunkFunction(TypedDict):
    name: Optional[str]  # noqa: UP045
    arguments: str


class ChatCompletionMessageToolCallChunk(TypedDict):
    index: int
    id: str
    type: Literal["function"]
    function: ChatCompletionMessageToolCallChunkFunction


class ChatCompletionStreamResponseDeltaEmpty(TypedDict):
    pass


class ChatCompletionStreamResponseDeltaFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionStreamResponseDelta(TypedDict, total=False):
    content: Optional[str]  # noqa: UP045
    function_call: ChatCompletionStreamResponseDeltaFunctionCall
    tool_calls: List[ChatCompletionMessageToolCallChunk]  # noqa: UP006
    role: Literal["system", "user", "assistant", "tool"]


class ChatCompletionStreamResponseChoice(TypedDict):
    index: int
    delta: ChatCompletionStreamResponseDelta | ChatCompletionStreamResponseDeltaEmpty
    finish_reason: Optional[Literal["stop", "length", "tool_calls", "function_call"]]  # noqa: UP045
    logprobs: Optional[ChatCompletionLogprobs]  # noqa: UP045


class CreateChatCompletionStreamResponse(TypedDict):
    id: str
    model: str
    object: Literal["chat.completion.chunk"]
    created: int
    choices: List[ChatCompletionStreamResponseChoice]  # noqa: UP006


class ChatCompletionFunctions(TypedDict, total=False):
    name: str
    description: str
    parameters: Dict[str, JsonType]  # noqa: UP006


class ChatCompletionFunctionCallOption(TypedDict):
    name: str


class ChatCompletionRequestResponseFormat(TypedDict, total=False):
    type: Literal["text", "json_object"]
    schema: JsonType


class ChatCompletionRequestMessageContentPartText(TypedDict):
    type: Literal["text"]
    text: str


class ChatCompletionRequestMessageContentPartImageImageUrl(TypedDict, total=False):
    url: str
    detail: Literal["auto", "low", "high"]


class ChatCompletionRequestMessageContentPartImage(TypedDict):
    type: Literal["image_url"]
    image_url: str | ChatCompletionRequestMessageContentPartImageImageUrl


ChatCompletionRequestMessageContentPart = Union[  # noqa: UP007
    ChatCompletionRequestMessageContentPartText, ChatCompletionRequestMessageContentPartImage]


class ChatCompletionRequestSystemMessage(TypedDict):
    role: Literal["system"]
    content: Optional[str]  # noqa: UP045


class ChatCompletionRequestUserMessage(TypedDict):
    role: Literal["user"]
    content: Optional[str | List[ChatCompletionRequestMessageContentPart]]  # noqa: UP006,UP045


class ChatCompletionRequestAssistantMessageFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionRequestAssistantMessage(TypedDict, total=False):
    role: Literal["assistant"]
    content: Optional[str]  # noqa: UP045
    tool_calls: ChatCompletionMessageToolCalls
    function_call: ChatCompletionRequestAssistantMessageFunctionCall


class ChatCompletionRequestToolMessage(TypedDict):
    role: Literal["tool"]
    content: Optional[str]  # noqa: UP045
    tool_call_id: str


class ChatCompletionRequestFunctionMessage(TypedDict):
    role: Literal["function"]
    content: Optional[str]  # noqa: UP045
    name: str


ChatCompletionRequestMessage = Union[  # noqa: UP007
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestUserMessage, ChatCompletionRequestToolMessage, ChatCompletionRequestFunctionMessage]


class ChatCompletionRequestFunctionCallOption(TypedDict):
    name: str


ChatCompletionRequestFunctionCall = Union[Literal["none", "auto"], ChatCompletionRequestFunctionCallOption]  # noqa: UP007
ChatCompletionFunctionParameters = Dict[str, JsonType]  # noqa: UP006


class ChatCompletionToolFunction(TypedDict, total=False):
    name: str
    description: str
    parameters: ChatCompletionFunctionParameters


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: ChatCompletionToolFunction


class ChatCompletionNamedToolChoiceFunction(TypedDict):
    name: str


class ChatCompletionNamedToolChoice(TypedDict):
    type: Literal["function"]
    function: ChatCompletionNamedToolChoiceFunction


ChatCompletionToolChoiceOption = Union[Literal["none", "auto", "required"], ChatCompletionNamedToolChoice]  # noqa: UP007

# the older names llama-cpp-python keeps
EmbeddingData = Embedding
CompletionChunk = CreateCompletionResponse
Completion = CreateCompletionResponse
CreateCompletionStreamResponse = CreateCompletionResponse
ChatCompletionMessage = ChatCompletionResponseMessage
ChatCompletionChoice = ChatCompletionResponseChoice
ChatCompletion = CreateChatCompletionResponse
ChatCompletionChunkDeltaEmpty = ChatCompletionStreamResponseDeltaEmpty
ChatCompletionChunkChoice = ChatCompletionStreamResponseChoice
ChatCompletionChunkDelta = ChatCompletionStreamResponseDelta
ChatCompletionChunk = CreateChatCompletionStreamResponse
ChatCompletionStreamResponse = CreateChatCompletionStreamResponse
ChatCompletionResponseFunction = ChatCompletionFunction
ChatCompletionFunctionCall = ChatCompletionResponseFunctionCall
