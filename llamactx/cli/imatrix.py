"""`llamactx imatrix -m MODEL -f TEXT [-o imatrix.gguf] [-c 512]`: llama-imatrix (tools/imatrix/imatrix.cpp): the
importance matrix llama-quantize's --imatrix reads, from this runtime's own forward pass.

As llama-imatrix: the text is tokenized with add_special and cut into chunks of n_ctx tokens, n_batch / n_ctx
chunks evaluated together as sequences of one batch from an empty cache, each chunk's first token replaced by BOS
when the model adds one, every token an output. `IMatrixCollector::collect_imatrix` sees the input of each
matrix multiplication by a weight named blk.* (output.weight too with --process-output) whose ubatch has at least
16 rows, and adds every row's squared activations to that weight's column sums in float32, row after row; expert
matrices (ggml_mul_mat_id) per selected expert. The counts are the rows seen. Saved as llama-imatrix's GGUF
(llamactx.gguf.imatrix_file, which --imatrix of `llamactx quantize` reads). The perplexity of the second half of
each chunk is printed as llama-imatrix prints it (--no-ppl to skip).

The activations are the fast ops' (llamactx.backend.fast), computed op by op so that each matmul's input is seen;
llama.cpp's matmul inputs are the same floats where the forward pass is bit-exact, and then so is the file.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from llamactx.cli.args import CommandError, add_common, add_llama_cpp_flags, read_text
from llamactx.gguf import imatrix_file

MIN_ROWS = 16  # collect_imatrix: "why are small batches ignored (<16 tokens)?"


class Collector:
    """IMatrixCollector's m_stats: weight name -> (sums (n_mat, ne0) float32, counts (n_mat,) int64)."""

    def __init__(self, chunk_size: int, process_output: bool = False):
        self.chunk_size = chunk_size
        self.process_output = process_output
        self.stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.last_chunk = 0

    def wants(self, name: str, n_rows: int) -> bool:
        """collect_imatrix's `ask` for a GGML_OP_MUL_MAT."""
        return n_rows >= MIN_ROWS and (name.startswith("blk.") or (self.process_output and name == "output.weight"))

    def add_rows(self, name: str, x: np.ndarray, n_mat: int = 1) -> None:
        """A dense matmul's input x (n, ne0): each row's squares added in order (one count per row)."""
        sums, counts = self._entry(name, x.shape[-1], n_mat)
        acc = sums[0]  # (ne0,)
        for row in np.asarray(x, np.float32):
            acc += row * row
        counts[0] += x.shape[0]
        self._update_chunks(name)

    def add_expert_rows(self, name: str, x: np.ndarray, selected: np.ndarray, n_expert: int) -> None:
        """A ggml_mul_mat_id's input: x (n, ne0) or (n, k, ne0), selected (n, k); slot-major as collect_imatrix."""
        sums, counts = self._entry(name, x.shape[-1], n_expert)
        n, k = selected.shape
        for idx in range(k):
            for row in range(n):
                ex = int(selected[row, idx])
                v = x[row] if x.ndim == 2 else x[row, idx]
                sums[ex] += v * v
                counts[ex] += 1
        self._update_chunks(name)

    def _entry(self, name: str, ne0: int, n_mat: int) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.stats:
            self.stats[name] = (np.zeros((n_mat, ne0), np.float32), np.zeros(n_mat, np.int64))
        sums, counts = self.stats[name]
        if sums.shape != (n_mat, ne0):
            raise CommandError(f"imatrix: inconsistent size for '{name}' ({sums.size} vs {n_mat * ne0})")
        return sums, counts

    def _update_chunks(self, name: str) -> None:
        sums, counts = self.stats[name]
        if not np.isfinite(sums).all():
            raise CommandError(f"imatrix: non-finite values detected in '{name}'")
        self.last_chunk = max(self.last_chunk, int(counts.max()) // self.chunk_size)

    def save(self, path: str, datasets: list[str]) -> None:
        imatrix_file.save(path, self.stats, datasets, self.last_chunk, self.chunk_size)


def collecting_ops(model, collector: Collector):
    """The fast ops, run op by op, with every weight matmul's input handed to `collector` first."""
    from llamactx.backend.fast import FastOps

    class CollectingOps(FastOps):
        _depth = 0

        def compute_graph(self, build, params):
            return build(self, params)  # op by op: a recorded program would run the matmuls unseen

        def _see(self, x, weights):
            if self._depth == 0:
                for w in weights:
                    name = getattr(w, "name", "")
                    if collector.wants(name, x.shape[0]):
                        collector.add_rows(name, x)

        def _inner(self, fn, *args):
            self._depth += 1
            try:
                return fn(*args)
            finally:
                self._depth -= 1

        def matmul(self, x, weight):
            self._see(x, [weight])
            return self._inner(super().matmul, x, weight)

        def matmuls(self, x, weights):
            self._see(x, weights)
            return self._inner(super().matmuls, x, weights)

        def matmul_id(self, x, weight, selected):
            if self._depth == 0:
                collector.add_expert_rows(getattr(weight, "name", ""), x, selected, int(weight.shape[2]))
            return self._inner(super().matmul_id, x, weight, selected)

    return CollectingOps(model)


def compute_imatrix(model, text: str, n_ctx: int, n_batch: int, n_ubatch: int, n_threads: int, n_chunks: int,
                    collector: Collector, parse_special: bool = False, compute_ppl: bool = True,
                    flash_attn: str = "auto", out=None) -> None:
    """imatrix.cpp `compute_imatrix`: evaluate the chunks, the collector seeing every weight matmul."""
    from llamactx.batch import Batch
    from llamactx.context import Context
    from llamactx.cparams import ContextParams

    out = out or sys.stdout
    vocab = model.vocab
    n_seq = max(1, n_batch // n_ctx)
    n_kv = n_seq * n_ctx
    n_batch = min(n_batch, n_kv)
    tokens = vocab.tokenize(text, add_special=True, parse_special=parse_special)
    if len(tokens) < 2 * n_ctx:
        raise CommandError(f"imatrix: you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; the "
                           f"text tokenizes to only {len(tokens)} tokens")
    n_chunk_max = len(tokens) // n_ctx
    n_chunk = n_chunk_max if n_chunks < 0 else min(n_chunks, n_chunk_max)
    num_batches = (n_ctx + n_batch - 1) // n_batch
    ctx = Context(model, ContextParams(n_ctx=n_kv, n_batch=n_batch, n_ubatch=min(n_ubatch, n_batch), n_seq_max=n_seq,
                                       n_threads=n_threads, n_threads_batch=n_threads, flash_attn=flash_attn),
                  ops=collecting_ops(model, collector))
    print(f"compute_imatrix: computing over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, n_seq={n_seq}",
          file=sys.stderr)
    nll: list[float] = []
    for i in range(0, n_chunk, n_seq):
        start = i * n_ctx
        n_seq_batch = min(n_seq, n_chunk - i)
        ctx.memory.clear(data=True)
        logits = [[] for _ in range(n_seq_batch)]
        for j in range(num_batches):
            batch_start = start + j * n_batch
            size = min(start + n_ctx - batch_start, n_batch)
            batch = Batch(size * n_seq_batch)
            for seq in range(n_seq_batch):
                chunk = tokens[batch_start + seq * n_ctx: batch_start + seq * n_ctx + size]
                if vocab.add_bos and j == 0:
                    chunk = [vocab.bos] + chunk[1:]
                for k, t in enumerate(chunk):
                    batch.add(t, j * n_batch + k, (seq,), True)
            if ctx.decode(batch) != 0:
                raise RuntimeError("imatrix: failed to eval")
            rows = np.array(ctx.get_logits())  # (size * n_seq_batch, n_vocab)
            for seq in range(n_seq_batch):
                logits[seq].append(rows[seq * size:(seq + 1) * size])
        if compute_ppl:
            for seq in range(n_seq_batch):
                seq_start = start + seq * n_ctx
                nll += _nll(np.concatenate(logits[seq]), tokens[seq_start:seq_start + n_ctx])
                print(f"[{i + seq + 1}]{math.exp(sum(nll) / len(nll)):.4f},", end="", file=out, flush=True)
    print(file=out)
    if compute_ppl and len(nll) > 1:
        mean = sum(nll) / len(nll)
        var = sum(v * v for v in nll) / len(nll) - mean * mean
        ppl = math.exp(mean)
        print(f"Final estimate: PPL = {ppl:.4f} +/- {math.sqrt(max(var, 0.0) / (len(nll) - 1)) * ppl:.5f}",
              file=out)


def _nll(logits: np.ndarray, chunk: list[int]) -> list[float]:
    """-log p of tokens n_ctx/2+1 .. n_ctx-1 (process_logits: float64 log-softmax of each row)."""
    first = len(chunk) // 2
    rows = logits[first:len(chunk) - 1].astype(np.float64)  # (n_scored, n_vocab)
    m = rows.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
    targets = np.asarray(chunk[first + 1:])
    return list(lse - rows[np.arange(len(targets)), targets])


def add_parser(sub):
    p = sub.add_parser("imatrix", help="llama-imatrix: the importance matrix of a model over a text file")
    p.add_argument("-f", "--file", required=True, help="the text to evaluate (its path is recorded as the dataset)")
    p.add_argument("-o", "--output-file", default="imatrix.gguf", help="output GGUF (default imatrix.gguf)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="chunk size in tokens (default 512)")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size (default 512)")
    p.add_argument("--chunks", type=int, default=-1, help="max chunks (-1 = all)")
    p.add_argument("--process-output", action="store_true", help="collect output.weight too")
    p.add_argument("--no-ppl", action="store_true", help="do not compute the perplexity")
    p.add_argument("--parse-special", action="store_true", help="parse special tokens in the text")
    add_common(p)
    add_llama_cpp_flags(p)
    p.set_defaults(func=run_imatrix)
    return p


def run_imatrix(args) -> int:
    from llamactx.embedded import resolve_model_path
    from llamactx.model import Model

    n_ctx = args.ctx_size
    if n_ctx < 2:
        raise CommandError(f"imatrix: --ctx-size {n_ctx} must be at least 2")
    if args.batch_size < 1 or args.ubatch_size < 1:
        raise CommandError("imatrix: --batch-size and --ubatch-size must be positive")
    if args.batch_size >= n_ctx and args.batch_size % n_ctx:
        raise CommandError(f"imatrix: --batch-size {args.batch_size} must be below --ctx-size {n_ctx} or a "
                           "multiple of it")
    out_dir = Path(args.output_file).parent
    if not out_dir.is_dir():
        raise CommandError(f"imatrix: the output's directory '{out_dir}' does not exist")
    text = read_text(args.file, "text file")
    model = Model.load(resolve_model_path(args.model))
    collector = Collector(n_ctx, args.process_output)
    compute_imatrix(model, text, n_ctx, args.batch_size, args.ubatch_size, args.threads, args.chunks, collector,
                    args.parse_special, not args.no_ppl, args.flash_attn)
    collector.save(args.output_file, [args.file])
    print(f"imatrix: saved {len(collector.stats)} entries ({collector.last_chunk} chunks) to '{args.output_file}'",
          file=sys.stderr)
    return 0
