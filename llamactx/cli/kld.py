"""KL divergence against a base model: llama-perplexity's `--kl-divergence-base FILE` / `--kl-divergence`
(tools/perplexity/perplexity.cpp: the uint16 `log_softmax`, `kl_divergence_result`, `kl_divergence`).

The base file, little-endian: `_logits_`, int32 n_ctx, int32 n_vocab, int32 n_chunk, the n_chunk * n_ctx int32
tokens of the text (BOS not substituted), then for each chunk its n_ctx - 1 - n_ctx/2 scored rows of
nv = 2 * ((n_vocab + 1) / 2) + 4 uint16: float32 scale and float32 min_log_prob, then each logit above
min_logit = max(min, max - 16) as nearest_int((logit - min_logit) / scale), scale = (max - min_logit) / 65535
(0 at or below min_logit; a zero pad when n_vocab is odd). A log-prob is read back as scale * u + min_log_prob.

The arithmetic is the C's, float by float: expf (libm) summed in double, float log_sum_exp, float nll; the
sums of `kl_divergence_result` in double in token order (llama-perplexity's worker threads add their partial sums
in the order they finish, which can move the last bits of a double, never a printed digit in practice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from llamactx.cli.args import CommandError

MAGIC = b"_logits_"
_F32 = np.float32
_STATS = ("sum_nll", "sum_nll2", "sum_nll_base", "sum_nll_base2", "sum_nll_nll_base", "sum_kld", "sum_kld2",
          "sum_p_diff", "sum_p_diff2", "sum_p_diff4")


def row_width(n_vocab: int) -> int:
    """uint16 values per scored row: the two floats, the vocabulary, even length."""
    return 2 * ((n_vocab + 1) // 2) + 4


@numba.njit(cache=True)
def _compress_rows(logits, tokens, out):  # pragma: no cover - compiled
    """perplexity.cpp `log_softmax(n_vocab, logits, log_prob, tok)` per row; returns the float nll per row."""
    n_rows, n_vocab = logits.shape
    nll = np.empty(n_rows, np.float64)
    for r in range(n_rows):
        x = logits[r]
        max_logit = x[0]
        min_logit = x[0]
        for i in range(1, n_vocab):
            if max_logit < x[i]:
                max_logit = x[i]
            if x[i] < min_logit:
                min_logit = x[i]
        lo = max_logit - _F32(16.0)
        if min_logit < lo:
            min_logit = lo
        sum_exp = 0.0
        for i in range(n_vocab):
            sum_exp += _F32(math.exp(x[i] - max_logit))
        log_sum_exp = _F32(math.log(sum_exp))
        min_log_prob = min_logit - max_logit - log_sum_exp
        scale = (max_logit - min_logit) / _F32(65535.0)
        head = np.empty(2, np.float32)
        head[0] = scale
        head[1] = min_log_prob
        h = head.view(np.uint16)
        for k in range(4):
            out[r, k] = h[k]
        if scale != _F32(0.0):
            inv_scale = _F32(1.0) / scale
            for i in range(n_vocab):
                if x[i] > min_logit:
                    v = inv_scale * (x[i] - min_logit) + _F32(12582912.0)  # nearest_int
                    out[r, 4 + i] = np.uint16((np.int64(v) - 12582912) & 0xFFFF)
                else:
                    out[r, 4 + i] = 0
        else:
            for i in range(n_vocab):
                out[r, 4 + i] = 0
        for i in range(4 + n_vocab, out.shape[1]):
            out[r, i] = 0
        nll[r] = max_logit + log_sum_exp - x[tokens[r]]
    return nll


def compress_log_probs(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the base file (n, nv) uint16, the nll of each target (n,) float64) for logits (n, n_vocab)."""
    logits = np.ascontiguousarray(logits, np.float32)
    out = np.empty((logits.shape[0], row_width(logits.shape[1])), np.uint16)
    nll = _compress_rows(logits, np.ascontiguousarray(targets, np.int64), out)
    return out, nll


@numba.njit(cache=True)
def _kld_rows(logits, base, tokens, sums, counts, kld_values, p_diff_values):  # pragma: no cover - compiled
    """perplexity.cpp `log_softmax(n_vocab, logits, base_log_prob, tok, kld)` per row. sums: the ten double
    sums of kl_divergence_result (order of _STATS), counts: n_same_top, count; max |p_diff| is returned."""
    n_rows, n_vocab = logits.shape
    max_p_diff = _F32(0.0)
    for r in range(n_rows):
        x = logits[r]
        max_logit = x[0]
        imax = 0
        for i in range(1, n_vocab):
            if x[i] > max_logit:
                max_logit = x[i]
                imax = i
        sum_exp = 0.0
        for i in range(n_vocab):
            sum_exp += _F32(math.exp(x[i] - max_logit))
        log_sum_exp = _F32(math.log(sum_exp))
        head = base[r, :4].copy().view(np.float32)
        scale = head[0]
        min_log_prob = head[1]
        tok = tokens[r]
        nll = max_logit + log_sum_exp - x[tok]
        sums[0] += nll
        sums[1] += nll * nll
        nll_base = -(scale * _F32(base[r, 4 + tok]) + min_log_prob)
        sums[2] += nll_base
        sums[3] += nll_base * nll_base
        sums[4] += nll * nll_base
        max_logit += log_sum_exp
        s = 0.0
        imax_base = -1
        p_log_base_max = _F32(0.0)
        for i in range(n_vocab):
            p_log_base = scale * _F32(base[r, 4 + i]) + min_log_prob
            if i == 0 or p_log_base > p_log_base_max:
                p_log_base_max = p_log_base
                imax_base = i
            if p_log_base > _F32(-16.0):
                p_base = _F32(math.exp(p_log_base))
                s += p_base * (p_log_base - x[i] + max_logit)
        sums[5] += s
        sums[6] += s * s
        counts[1] += 1
        if imax == imax_base:
            counts[0] += 1
        p_base = _F32(math.exp(-nll_base))
        p = _F32(math.exp(-nll))
        p_diff = p - p_base
        sums[7] += p_diff
        p_diff2 = np.float64(p_diff * p_diff)
        sums[8] += p_diff2
        sums[9] += p_diff2 * p_diff2
        if abs(p_diff) > max_p_diff:
            max_p_diff = abs(p_diff)
        kld_values[r] = _F32(s)
        p_diff_values[r] = p_diff
    return max_p_diff


@dataclass
class KLDivergence:
    """kl_divergence_result plus the per-token KLD and Δp values of every scored position."""
    sums: np.ndarray = field(default_factory=lambda: np.zeros(len(_STATS), np.float64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))  # n_same_top, count
    max_p_diff: float = 0.0
    kld_values: list = field(default_factory=list)
    p_diff_values: list = field(default_factory=list)

    def add(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> None:
        """Score logits (n, n_vocab) against the base file's rows (n, nv) for the targets (n,)."""
        n = logits.shape[0]
        kld = np.empty(n, np.float32)
        p_diff = np.empty(n, np.float32)
        m = _kld_rows(np.ascontiguousarray(logits, np.float32), np.ascontiguousarray(base_rows, np.uint16),
                      np.ascontiguousarray(targets, np.int64), self.sums, self.counts, kld, p_diff)
        self.max_p_diff = max(self.max_p_diff, float(m))
        self.kld_values.append(kld)
        self.p_diff_values.append(p_diff)

    def __getattr__(self, name):
        if name in _STATS:
            return float(self.sums[_STATS.index(name)])
        raise AttributeError(name)

    @property
    def count(self) -> int:
        return int(self.counts[1])

    @property
    def n_same_top(self) -> int:
        return int(self.counts[0])


def write_header(f, n_ctx: int, n_vocab: int, n_chunk: int, tokens: list[int]) -> None:
    """The base file's head: magic, n_ctx, n_vocab, n_chunk, the first n_chunk * n_ctx tokens."""
    f.write(MAGIC)
    f.write(np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
    f.write(np.asarray(tokens[: n_chunk * n_ctx], "<i4").tobytes())


@dataclass
class BaseFile:
    """A base file opened for reading: its header read and checked, rows read chunk by chunk."""
    path: str
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    f: object

    @classmethod
    def open(cls, path: str, n_vocab: int) -> BaseFile:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise CommandError(f"perplexity: --kl-divergence-base {path}: cannot open it: {e.strerror}") from None
        if f.read(8) != MAGIC:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path} does not look like a file containing "
                               "log-probabilities (no _logits_ magic)")
        head = f.read(12)
        if len(head) < 12:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path}: failed reading n_ctx, n_vocab, n_chunk")
        n_ctx, n_vocab_file, n_chunk = (int(v) for v in np.frombuffer(head, "<i4"))
        if n_vocab_file != n_vocab:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path}: inconsistent vocabulary ({n_vocab_file} "
                               f"in the file vs {n_vocab} in the model)")
        if n_ctx < 4 or n_chunk < 1:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path}: n_ctx {n_ctx} / n_chunk {n_chunk} out of "
                               "range (n_ctx >= 4, n_chunk >= 1)")
        raw = f.read(4 * n_ctx * n_chunk)
        if len(raw) < 4 * n_ctx * n_chunk:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path}: failed reading the {n_ctx * n_chunk} "
                               "evaluation tokens")
        tokens = np.frombuffer(raw, "<i4").astype(np.int64)
        if tokens.min() < 0 or tokens.max() >= n_vocab:
            f.close()
            raise CommandError(f"perplexity: --kl-divergence-base {path}: a token id out of range [0, {n_vocab})")
        return cls(path, n_ctx, n_vocab, n_chunk, tokens, f)

    def read_chunk(self, i: int) -> np.ndarray:
        """The scored rows (n_ctx - 1 - n_ctx/2, nv) uint16 of chunk i."""
        n = self.n_ctx - 1 - self.n_ctx // 2
        nv = row_width(self.n_vocab)
        raw = self.f.read(2 * n * nv)
        if len(raw) < 2 * n * nv:
            raise CommandError(f"perplexity: --kl-divergence-base {self.path}: failed reading log-probs for chunk {i}")
        return np.frombuffer(raw, "<u2").reshape(n, nv)

    def close(self) -> None:
        self.f.close()


def _div(a: float, b: float) -> float:
    """a / b as IEEE doubles divide (inf or nan for b == 0), as the C prints it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def _mean_and_uncertainty(s: float, s2: float, count: int) -> tuple[float, float]:
    if count < 1:
        return 0.0, 0.0
    f = s / count
    df = s2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def _covariance(sa: float, sb: float, sab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sab / count - (sa / count) * (sb / count)) / (count - 1)


def chunk_line(i: int, k: KLDivergence) -> str:
    """The row llama-perplexity prints after chunk i (1-based): PPL, ln ratio, KLD, Δp RMS, same top p."""
    log_ppl = _mean_and_uncertainty(k.sum_nll, k.sum_nll2, k.count)
    ppl = math.exp(log_ppl[0])
    line = f"{i:4d}    {ppl:9.4f} ± {ppl * log_ppl[1]:9.4f}"
    log_base = _mean_and_uncertainty(k.sum_nll_base, k.sum_nll_base2, k.count)
    cov = _covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
    ratio_unc = _sqrt(log_ppl[1] ** 2 + log_base[1] ** 2 - 2.0 * cov)
    line += f"    {log_ppl[0] - log_base[0]:10.5f} ± {ratio_unc:10.5f}"
    kl = _mean_and_uncertainty(k.sum_kld, k.sum_kld2, k.count)
    line += f"    {kl[0]:10.5f} ± {kl[1]:10.5f}"
    mse = _mean_and_uncertainty(k.sum_p_diff2, k.sum_p_diff4, k.count)
    rms = math.sqrt(mse[0])
    line += f"    {100.0 * rms:6.3f} ± {100.0 * _div(0.5, rms) * mse[1]:6.3f} %"
    top = k.n_same_top / k.count
    line += f"    {100.0 * top:6.3f} ± {100.0 * _sqrt(_div(top * (1 - top), k.count - 1)):6.3f} %"
    return line


CHUNK_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
                "            Same top p")


def _percentile(values: np.ndarray, fraction: np.float32) -> np.float32:
    """perplexity.cpp's `percentile` lambda, in float."""
    if fraction <= 0:
        return values[0]
    if fraction >= 1:
        return values[-1]
    p = _F32(fraction * _F32(len(values) - 1))
    ip = int(p)
    p = _F32(p - _F32(ip))
    return _F32(_F32(_F32(1) - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def _median(values: np.ndarray) -> np.float32:
    n = len(values)
    return _F32(_F32(0.5) * (values[n // 2] + values[n // 2 - 1])) if n % 2 == 0 else values[n // 2]


def report(k: KLDivergence) -> list[str]:
    """The three statistics blocks llama-perplexity prints at the end (none for fewer than 100 tokens)."""
    if k.count < 100:
        return []
    kld = np.sort(np.concatenate(k.kld_values))
    p_diff = np.sort(np.concatenate(k.p_diff_values))
    out = ["====== Perplexity statistics ======"]
    log_ppl = _mean_and_uncertainty(k.sum_nll, k.sum_nll2, k.count)
    ppl = math.exp(log_ppl[0])
    ppl_unc = ppl * log_ppl[1]
    out.append(f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl_unc:10.6f}")
    log_base = _mean_and_uncertainty(k.sum_nll_base, k.sum_nll_base2, k.count)
    base = math.exp(log_base[0])
    base_unc = base * log_base[1]
    out.append(f"Mean PPL(base)                : {base:10.6f} ± {base_unc:10.6f}")
    cov = _covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count)
    out.append(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * _div(cov, log_ppl[1] * log_base[1]):6.2f}%")
    ratio = log_ppl[0] - log_base[0]
    ratio_unc = _sqrt(log_ppl[1] ** 2 + log_base[1] ** 2 - 2.0 * cov)
    out.append(f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_unc:10.6f}")
    out.append(f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f} ± {math.exp(ratio) * ratio_unc:10.6f}")
    diff_unc = _sqrt(ppl_unc * ppl_unc + base_unc * base_unc - 2.0 * ppl * base * cov)
    out.append(f"Mean PPL(Q)-PPL(base)         : {ppl - base:10.6f} ± {diff_unc:10.6f}")
    out += ["", "====== KL divergence statistics ======"]
    kl = _mean_and_uncertainty(k.sum_kld, k.sum_kld2, k.count)
    out.append(f"Mean    KLD: {kl[0]:10.6f} ± {kl[1]:10.6f}")
    out.append(f"Maximum KLD: {kld[-1]:10.6f}")
    for label, frac in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900)):
        out.append(f"{label}   KLD: {_percentile(kld, _F32(frac)):10.6f}")
    out.append(f"Median  KLD: {_median(kld):10.6f}")
    for label, frac in (("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001)):
        out.append(f"{label}   KLD: {_percentile(kld, _F32(frac)):10.6f}")
    out.append(f"Minimum KLD: {kld[0]:10.6f}")
    out += ["", "====== Token probability statistics ======"]
    pd = _mean_and_uncertainty(k.sum_p_diff, k.sum_p_diff2, k.count)
    out.append(f"Mean    Δp: {100.0 * pd[0]:6.3f} ± {100.0 * pd[1]:5.3f} %")
    out.append(f"Maximum Δp: {100.0 * float(p_diff[-1]):6.3f}%")
    for label, frac in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750)):
        out.append(f"{label}   Δp: {100.0 * float(_percentile(p_diff, _F32(frac))):6.3f}%")
    out.append(f"Median  Δp: {100.0 * float(_median(p_diff)):6.3f}%")
    for label, frac in (("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001)):
        out.append(f"{label}   Δp: {100.0 * float(_percentile(p_diff, _F32(frac))):6.3f}%")
    out.append(f"Minimum Δp: {100.0 * float(p_diff[0]):6.3f}%")
    mse = _mean_and_uncertainty(k.sum_p_diff2, k.sum_p_diff4, k.count)
    rms = math.sqrt(mse[0])
    out.append(f"RMS Δp    : {100.0 * rms:6.3f} ± {100.0 * _div(0.5, rms) * mse[1]:5.3f} %")
    top = k.n_same_top / k.count
    out.append(f"Same top p: {100.0 * top:6.3f} ± {100.0 * _sqrt(_div(top * (1.0 - top), k.count - 1)):5.3f} %")
    return out
