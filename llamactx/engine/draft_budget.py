"""The draft budget: how many tokens of a draft are worth verifying in a step, from what a decode row costs on this
machine and how often a slot's drafts are accepted. llama.cpp has no counterpart: common/speculative.cpp's
common_speculative_draft drafts and llama-server (tools/server/server-context.cpp) verifies every draft in full,
cut only by the slot's room (get_n_draft_max); the budget only ever shortens that draft.

Verifying every draft in full, llama-server with 8 busy slots serves fewer tokens/s with ngram-simple than
without. What an extra row of a
decode costs depends on the CPU: with AVX-512 a decode of 8 rows took about what 1 row takes (the weights are read
once), with AVX2 each row costs a good part of a token (issue #48: ngram-simple then lost 14% on a copy task whose
drafts were mostly wrong). So `DecodeCost` measures it on the machine, online, for the kernels this process
runs (the ISA they were compiled for): the time of every decode of generating sequences only (no prompt rows), by
its number of rows, as the least time per row count (a first compile or another process only adds time) and a line
through them; until two row counts are measured it assumes `free_rows` rows for the price of one. `DraftBudget`
keeps each slot's rate of accepted draft tokens, a, and verifies the draft length n that maximizes the step's
expected tokens (1 + a + a**2 + ... + a**n for a lone stream) over its decode's cost. A lone stream whose drafts
are accepted thus keeps long drafts even where each row costs a good part of a token (AVX2), and one whose drafts
are mostly wrong stops verifying them; its later drafts are then only followed ("shadow" drafts:
`DraftBudget.follow` compares them with the tokens the sampler picks), so that the rate, and the drafts, come
back when the model follows the text again. Two traps kept drafts away from a model that follows the text
(issue #48, SmolLM2 compiled for AVX2, where it wanders and then loops on its own text): row counts measured
only while their graphs were planned or under a burst of load, never measured again once they looked too
dear, and a rate held down by many earlier wrong drafts. So a count far above the line from a few samples is
priced by the line (and the line is fitted without it), where no draft pays a slot whose drafts are accepted
tries the counts with few samples, or none lately (`stale`), at the prior's cost (a probe), and the rate is at
least k / (k + 1) after k draft tokens accepted in a row, shadow drafts' tokens credited as they are followed:
the drafts come back about ten tokens after the model starts to copy. Where every row costs half a decode
(AVX2), a copy pays only with long drafts (12 tokens and more), so probes never cut a draft the line pays for.
Which tokens are verified never changes the output.
"""

from __future__ import annotations

from collections import deque


class DecodeCost:
    """Seconds per decode of generating sequences by its number of rows, measured (`observe`): per row count the
    least of its last WINDOW samples (what the decode costs when nothing else runs: a compile, a graph planned
    for a new shape or another process taking the core only ever add time), and the line through those (least
    squares, each count weighted by its samples, fitted again without the counts far above it: `_fit`).
    `seconds(n_rows)` is a count's own least time once it has MIN_SAMPLES samples, the line's value before (a
    count not tried yet) and where its own time lies more than OUTLIER above the line from fewer than WINDOW
    samples (load's time: the line, not a few unlucky decodes, prices it, so it is tried again); before two row
    counts are known, the prior: rows up to `free_rows` cost one decode, each past them one more. A count's own
    time, not the line, decides where the kernels' cost is not linear in the rows (the quant kernels take rows
    in tiles: 4 rows can cost less than 3). A count with fewer than MIN_SAMPLES samples, or none in the last
    REFRESH decodes, is `stale`: its time may be a compile's, or another load's than now's (DraftBudget tries it
    at the prior's price when nothing else pays)."""

    # OUTLIER: how far above the line a count's least time, from fewer than WINDOW samples, is taken for load's
    WINDOW, MIN_SAMPLES, N_ROWS_MAX, REFRESH, OUTLIER = 9, 3, 1024, 256, 0.25

    def __init__(self, free_rows: int):
        self.free_rows = free_rows
        self._samples: dict[int, deque[float]] = {}  # rows -> the last WINDOW decode times (seconds)
        self._least: dict[int, float] = {}  # rows -> the least of its samples
        self._line: tuple[float, float] | None = None  # (fixed, per_row) seconds, None: the prior
        self._n_observed = 0  # decodes observed
        self._seen: dict[int, int] = {}  # rows -> _n_observed at its last sample

    def observe(self, n_rows: int, seconds: float) -> None:
        """A decode of `n_rows` rows (generating sequences and their drafts only) took `seconds`."""
        if not 0 < n_rows <= self.N_ROWS_MAX or not seconds > 0:
            return
        window = self._samples.setdefault(n_rows, deque(maxlen=self.WINDOW))
        window.append(seconds)
        self._least[n_rows] = min(window)
        self._n_observed += 1
        self._seen[n_rows] = self._n_observed
        self._line = self._fit()

    def stale(self, n_rows: int) -> bool:
        """Whether `n_rows`'s time is not (or no longer) known: fewer than MIN_SAMPLES samples, or none in the
        last REFRESH decodes."""
        return (len(self._samples.get(n_rows, ())) < self.MIN_SAMPLES
                or self._n_observed - self._seen[n_rows] > self.REFRESH)

    def hoped(self, n_rows: int) -> float:
        """What a decode of `n_rows` rows costs if the prior holds (`free_rows` rows for the price of one), in the
        unit of `seconds`: the lower bound a stale count is tried at."""
        return self.seconds(1) * max(1, n_rows - self.free_rows + 1)

    def _fit(self) -> tuple[float, float] | None:
        """The line through the counts' least times (least squares, weighted by samples), refitted without the
        counts that lie more than OUTLIER above it from fewer than WINDOW samples: a count tried only under a
        burst of load or while its graph was planned would tilt the line for every other count."""
        pts = [(r, self._least[r], len(s)) for r, s in self._samples.items() if len(s) >= 2]
        line = _least_squares(pts)
        while line is not None:
            kept = [p for p in pts if not self._outlier(p[1], p[2], line[0] + line[1] * p[0])]
            if len(kept) == len(pts) or len(kept) < 2:
                break
            pts, line = kept, _least_squares(kept)
        return line

    def _outlier(self, least: float, n_samples: int, on_line: float) -> bool:
        """Whether a count's least time, from `n_samples` samples, is load's rather than its own: more than OUTLIER
        above the line from fewer than WINDOW samples (the least of a full window is the count's own: a tile
        boundary can make a count dearer than the line)."""
        return n_samples < self.WINDOW and least > (1 + self.OUTLIER) * on_line

    @property
    def measured(self) -> bool:
        return self._line is not None

    @property
    def line(self) -> tuple[float, float] | None:
        """(fixed, per_row) seconds of the measured decodes' line; None while the prior holds."""
        return self._line

    def summary(self) -> str:
        """The measured line and each row count's time relative to one row's, for a report."""
        if self._line is None:
            return f"not measured yet (prior: {self.free_rows} rows for the price of one)"
        fixed, per_row = self._line
        one = self.seconds(1)
        counts = " ".join(f"{r}:{self._least[r] / one:.2f}" for r in sorted(self._samples)
                          if len(self._samples[r]) >= self.MIN_SAMPLES)
        return f"{1e3 * fixed:.2f} ms + {1e3 * per_row:.2f} ms/row; rows:x one row {counts}"

    def seconds(self, n_rows: int) -> float:
        """What a decode of `n_rows` rows costs (in decodes of one row while the prior holds)."""
        n_rows = max(n_rows, 1)
        if self._line is None:
            return float(max(1, n_rows - self.free_rows + 1))
        fixed, per_row = self._line
        on_line = fixed + per_row * n_rows
        n_samples = len(self._samples.get(n_rows, ()))
        if n_samples >= self.MIN_SAMPLES and not self._outlier(self._least[n_rows], n_samples, on_line):
            return self._least[n_rows]
        return on_line


def _least_squares(pts: list[tuple[int, float, int]]) -> tuple[float, float] | None:
    """(fixed, per_row) of the line through (rows, seconds, weight) points, per_row >= 0; None under two points."""
    if len(pts) < 2:
        return None
    w = sum(p[2] for p in pts)
    x = sum(p[0] * p[2] for p in pts) / w
    y = sum(p[1] * p[2] for p in pts) / w
    var = sum(p[2] * (p[0] - x) ** 2 for p in pts)
    slope = max(0.0, sum(p[2] * (p[0] - x) * (p[1] - y) for p in pts) / var)
    return max(y - slope * x, 1e-9), slope


class DraftBudget:
    """How many tokens of a slot's draft are worth verifying in this step (see the module docstring): per slot, a
    decayed count of accepted draft tokens and of drafts cut short, from a prior rate of 0.8, give the chance `a`
    that a draft token is accepted after the ones before it; a draft of n tokens then yields 1 + a + ... + a**n
    tokens expected, and the budget picks the n that yields the most tokens per second of the step's decode
    (`cost`, measured by the engine)."""

    # LOOKAHEAD: lengths tried past the best so far (a step is planned in Python: a bounded search);
    # PROBE_RATE: a slot accepting at least this rate tries stale row counts at the prior's cost (DecodeCost.hoped)
    PRIOR_RATE, PRIOR_WEIGHT, DECAY, P_MIN, LOOKAHEAD, PROBE_RATE = 0.8, 2.0, 0.9, 1e-3, 16, 0.9

    def __init__(self, free_rows: int, cost: DecodeCost | None = None):
        self.free_rows = free_rows
        self.cost = cost if cost is not None else DecodeCost(free_rows)
        self._counts: dict[int, tuple[float, float]] = {}  # seq_id -> (accepted tokens, rejections), decayed
        # seq_id -> (position, draft, tokens of it credited so far): a draft followed, not verified
        self._shadow: dict[int, tuple[int, tuple[int, ...], int]] = {}
        self._run: dict[int, int] = {}  # seq_id -> draft tokens accepted in a row since its last rejection

    def rate(self, seq_id: int) -> float:
        """The chance that a slot's next draft token is accepted, given that those before it were: the decayed
        counts' rate, or where more, k / (k + 1) for the current run of k tokens accepted in a row (verified or
        followed in a shadow draft). The counts remember many wrong drafts; the
        run says at once that the model follows the text again."""
        acc, rej = self._counts.get(seq_id, (0.0, 0.0))
        pending = self._shadow.get(seq_id)
        k = self._run.get(seq_id, 0) + (pending[2] if pending is not None else 0)
        return max((acc + self.PRIOR_RATE * self.PRIOR_WEIGHT) / (acc + rej + self.PRIOR_WEIGHT),
                   k / (k + 1))

    def cap(self, seq_id: int, n_gen: int, used: int, n_max: int) -> int:
        """At most `n_max` draft tokens for `seq_id` in a step of `n_gen` generating sequences whose batch holds
        `used` rows so far (each generating sequence's own row and the drafts placed before this one): the n
        that maximizes the step's expected tokens over its decode's cost. The rows placed so far are taken to
        yield a token each for the generating sequences and, for other drafts, this slot's rate.
        Where no draft pays, a slot whose drafts are accepted at PROBE_RATE or more takes the stale row counts
        (DecodeCost.stale) at the prior's price where that is less: a count measured once under a compile or a
        burst of load, or on another load than now's, is measured again instead of refusing the drafts for good
        (each probe verifies a draft that is expected to be mostly accepted, so it costs little even where rows
        are expensive). Only then: the prior (free_rows rows for the price of one) would otherwise pick short
        stale counts over the long drafts the measured line pays for (issue #48, AVX2: every row costs half a
        decode, and a copy's drafts of 12 tokens were cut to 3 to probe counts)."""
        if self.free_rows == 0:
            return n_max
        a = self.rate(seq_id)
        best_n = self._best(a, n_gen, used, n_max, probe=False)
        if best_n == 0 and a >= self.PROBE_RATE:
            best_n = self._best(a, n_gen, used, n_max, probe=True)
        return best_n

    def _best(self, a: float, n_gen: int, used: int, n_max: int, probe: bool) -> int:
        """The draft length up to n_max with the most expected tokens per second at rate `a` (`probe`: stale row
        counts at the prior's price where less)."""
        cost = self.cost
        expected = n_gen + max(used - n_gen, 0) * a  # tokens the step yields without this draft
        best_n, best = 0, expected / cost.seconds(used)
        p = 1.0
        for n in range(1, n_max + 1):
            p *= a
            if p < self.P_MIN or n - best_n > self.LOOKAHEAD:
                break
            expected += p
            seconds = cost.seconds(used + n)
            if probe and cost.stale(used + n):
                seconds = min(seconds, cost.hoped(used + n))
            value = expected / seconds
            if value > best:
                best_n, best = n, value
        return best_n

    def record(self, seq_id: int, n_draft: int, n_accepted: int) -> None:
        """A verified draft of `n_draft` tokens had `n_accepted` accepted. A shadow draft still followed is settled
        first: what it was credited counts as a draft accepted whole (the verified tokens are not counted twice)."""
        self.shadow_drop(seq_id)
        self._run[seq_id] = self._run.get(seq_id, 0) + n_accepted if n_accepted == n_draft else 0
        acc, rej = self._counts.get(seq_id, (0.0, 0.0))
        self._counts[seq_id] = (acc * self.DECAY + n_accepted, rej * self.DECAY + (n_accepted < n_draft))

    def shadow(self, seq_id: int, position: int, draft) -> None:
        """A draft for the tokens from `position` on that is not verified: `follow` scores it against the tokens
        sampled there, as if it had been (one at a time per slot)."""
        if draft and seq_id not in self._shadow:
            self._shadow[seq_id] = (position, tuple(draft), 0)

    def follow(self, seq_id: int, tokens) -> None:
        """Slot `seq_id` now holds `tokens`: a shadow draft they contradict or complete is recorded as verified.
        One they still follow is credited the tokens matched so far at once, so that a model that follows the
        text again gets its drafts back within a few tokens, not only after a whole draft (48 tokens for
        ngram-simple); its record at the end replaces the credit."""
        pending = self._shadow.get(seq_id)
        if pending is None:
            return
        position, draft, credited = pending
        got = tuple(tokens[position : position + len(draft)])
        n = 0
        while n < len(got) and got[n] == draft[n]:
            n += 1
        acc, rej = self._counts.get(seq_id, (0.0, 0.0))
        if n < len(got) or len(got) == len(draft):
            del self._shadow[seq_id]
            self._counts[seq_id] = (acc - credited, rej)
            self.record(seq_id, len(draft), n)
        elif n > credited:
            self._shadow[seq_id] = (position, draft, n)
            self._counts[seq_id] = (acc + n - credited, rej)

    def has_shadow(self, seq_id: int) -> bool:
        return seq_id in self._shadow

    def shadow_drop(self, seq_id: int) -> None:
        """Stop following slot `seq_id`'s shadow draft; the tokens it was credited count as accepted."""
        pending = self._shadow.pop(seq_id, None)
        if pending is not None and pending[2] > 0:
            acc, rej = self._counts.get(seq_id, (0.0, 0.0))
            self._counts[seq_id] = (acc - pending[2], rej)
            self.record(seq_id, pending[2], pending[2])

    def forget(self, seq_id: int) -> None:
        self._counts.pop(seq_id, None)
        self._run.pop(seq_id, None)
        self._shadow.pop(seq_id, None)
