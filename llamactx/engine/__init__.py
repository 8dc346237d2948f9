"""The engine: many sequences of one context, one batched decode per step (llama-server's update_slots,
nano-vllm's engine/).

    text_stream.py  TextStream: token bytes -> printable text, stop strings held back
    sequence.py     Sequence: one request's state (tokens, n_past, sampler, limits, finish reason)
"""

from llamactx.engine.sequence import Chunk, Completion, Limits, Sequence, SequenceStatus, Timings
from llamactx.engine.text_stream import TextStream

__all__ = ["Chunk", "Completion", "Limits", "Sequence", "SequenceStatus", "TextStream", "Timings"]
