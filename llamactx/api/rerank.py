"""Reranking: llama-server's /rerank request, prompt and response (tools/server: server-context.cpp `post_rerank`,
server-common.cpp `format_prompt_rerank` and `format_response_rerank`).

    req = parse(body, max_documents=8192)               # RerankQuery, or ProtocolError naming the field
    prompts = [format_prompt(model, req.query, d) for d in req.documents]
    scores = reranker.embed(prompts)[:, 0]              # Embedder(pooling="rank"): element 0 of the pooled output
    body = format_response(req, "smollm2", scores, [len(p) for p in prompts])

Two wire shapes, chosen as llama-server chooses: a body with "texts" is TEI's (a bare list of {"index", "score"},
"text" too with return_text), anything else Jina's / Cohere's ({"model", "object", "usage", "results": [{"index",
"relevance_score"}]}). Results are sorted by score, highest first, and cut to top_n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactx.api.protocol import ProtocolError

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"  # llama_model_chat_template(model, "rerank")


@dataclass(frozen=True, slots=True)
class RerankQuery:
    """A validated rerank request."""

    query: str
    documents: tuple[str, ...]
    top_n: int  # results kept (at most len(documents) are returned)
    is_tei: bool  # the body had "texts": TEI's response shape
    return_text: bool  # TEI only: each result carries its document's text
    model: str | None  # echoed in Jina's shape when given


def parse(body: Mapping[str, Any], max_documents: int) -> RerankQuery:
    """llama-server's checks, in its order ("query" first, then "documents" / "texts"), with a 400 naming the field
    for what it would silently replace by a default (a top_n that is not an integer, a documents value that is not
    a string array) or fail on with a 500 (a negative top_n)."""
    is_tei = "texts" in body
    if "query" not in body:
        raise ProtocolError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise ProtocolError(f'"query" must be a string, not {type(query).__name__}')
    field = "documents" if body.get("documents") is not None else "texts"
    documents = body.get(field)
    if documents is None or documents == []:
        raise ProtocolError('"documents" must be a non-empty string array')
    if not isinstance(documents, list):
        raise ProtocolError(f'"{field}" must be a non-empty string array, not {type(documents).__name__}')
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise ProtocolError(f'"{field}" must be a non-empty string array: {field}[{i}] is '
                                f"{type(doc).__name__} {doc!r:.40}")
    if len(documents) > max_documents:
        raise ProtocolError(f'"{field}" holds {len(documents)} documents, more than --embd-max-inputs = '
                            f"{max_documents}")
    top_n = body.get("top_n", len(documents))
    if top_n is None:
        top_n = len(documents)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise ProtocolError(f'"top_n" = {top_n!r} must be an integer >= 0')
    return_text = body.get("return_text", False)
    if not isinstance(return_text, bool):
        raise ProtocolError(f'"return_text" = {return_text!r} must be a boolean')
    model = body.get("model")
    return RerankQuery(query, tuple(documents), top_n, is_tei, is_tei and return_text,
                       model if isinstance(model, str) else None)


def format_prompt(model, query: str, document: str) -> list[int]:
    """The tokens scored for one (query, document) pair: the model's rerank template ("{query}" and "{document}"
    replaced, special tokens parsed, none added) when it has one, else [BOS] query [EOS] [SEP] doc [EOS], each
    special token only where the vocabulary asks for it (add_bos / add_eos / add_sep), EOS falling back to SEP."""
    vocab = model.vocab
    template = model.meta.get(RERANK_TEMPLATE_KEY)
    if isinstance(template, str):
        prompt = template.replace("{query}", query).replace("{document}", document)
        return vocab.tokenize(prompt, add_special=False, parse_special=True)
    eos = vocab.eos if vocab.eos >= 0 else vocab.sep
    out: list[int] = [vocab.bos] if vocab.add_bos else []
    out += vocab.tokenize(query, add_special=False, parse_special=False)
    if vocab.add_eos:
        out.append(eos)
    if vocab.add_sep:
        out.append(vocab.sep)
    out += vocab.tokenize(document, add_special=False, parse_special=False)
    if vocab.add_eos:
        out.append(eos)
    return out


def format_response(req: RerankQuery, model_name: str, scores: Sequence[float], n_tokens: Sequence[int]) -> Any:
    """The response body: TEI's list, or Jina's object with usage (the prompt tokens of every pair)."""
    label = "score" if req.is_tei else "relevance_score"
    results = []
    for i, score in enumerate(scores):
        item: dict[str, Any] = {"index": i, label: float(score)}
        if req.return_text:
            item["text"] = req.documents[i]
        results.append(item)
    results.sort(key=lambda r: r[label], reverse=True)  # stable: equal scores keep the documents' order
    results = results[:req.top_n]
    if req.is_tei:
        return results
    n = int(sum(n_tokens))
    return {"model": req.model or model_name, "object": "list",
            "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}
