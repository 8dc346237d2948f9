"""Write the tiny BERT rerankers: tests/data/tiny/tiny-bert.gguf's encoder (make_tiny_bert.py, the same tensors
and vocabulary) with a classifier head, as convert_hf_to_gguf.py writes a BERT cross-encoder (bge-reranker,
ms-marco-MiniLM), `bert.pooling_type` rank.

- tiny-bert-rerank.gguf: the head of BertForSequenceClassification / RobertaClassificationHead with one label:
  `cls.weight` (64 x 64, F16) and `cls.bias`, `cls.output.weight` (64 -> 1, F32) and `cls.output.bias`; no
  `bert.classifier.output_labels` (n_cls_out 1).
- tiny-bert-rerank-labels.gguf: three labels (`bert.classifier.output_labels`: n_cls_out 3),
  `bert.classifier.pooling_type` mean (the mean of the states goes into the head, not the first token's), and
  only the output projection (`cls.output.weight` 64 -> 3, F16, and its bias; no `cls.weight`, as
  jina-reranker-v1-tiny-en's single-layer head).

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_rerank.py
Then make llama.cpp's scores for them with make_tiny_rerank_reference.py (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_bert import bert_writer  # noqa: E402
from tests.data.tiny.make_tiny_models import N_EMBD, OUT  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

LABELS = ["entailment", "neutral", "contradiction"]


def main() -> list[Path]:
    wt, w = bert_writer(OUT / "tiny-bert-rerank.gguf", "tiny bert reranker", gguf.PoolingType.RANK)
    wt.mat("cls.weight", N_EMBD, N_EMBD, kind=T.F16)
    wt.vec("cls.bias", (N_EMBD,))
    wt.mat("cls.output.weight", N_EMBD, 1)
    wt.vec("cls.output.bias", (1,))
    paths = [finish(w)]
    wt, w = bert_writer(OUT / "tiny-bert-rerank-labels.gguf", "tiny bert classifier", gguf.PoolingType.RANK)
    w.add_classifier_output_labels(LABELS)
    w.add_uint32("bert.classifier.pooling_type", int(gguf.PoolingType.MEAN))  # LLM_KV_CLASSIFIER_POOLING_TYPE
    wt.mat("cls.output.weight", N_EMBD, len(LABELS), kind=T.F16)
    wt.vec("cls.output.bias", (len(LABELS),))
    paths.append(finish(w))
    return paths


if __name__ == "__main__":
    print(*main(), sep="\n")
