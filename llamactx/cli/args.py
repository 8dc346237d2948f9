"""llama.cpp's common arguments (common/arg.cpp) for the `llamactx` tools: the flags they share, how their values
are read (-fa on|off|auto, -ngl N, escapes: common.cpp `string_process_escapes`), the flags accepted with a notice
because they do not apply on this runtime, and the error every command-line mistake becomes (`CommandError`: one
line on stderr, exit status 1, never a traceback).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from llamactx.errors import LlamactxError


class CommandError(LlamactxError, ValueError):
    """A command-line argument or input file that cannot be used; printed as one line, exit status 1."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (an unknown flag, a bad value) are CommandErrors: one line, exit status 1."""

    def error(self, message: str):
        raise CommandError(f"{self.prog}: {message} (see {self.prog} --help)")


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file given on the command line, or CommandError saying what is wrong with it."""
    p = Path(path)
    if p.is_dir():
        raise CommandError(f"{what} '{path}' is a directory, not a file")
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(f"{what} '{path}' does not exist") from None
    except UnicodeDecodeError as e:
        raise CommandError(f"{what} '{path}' is not UTF-8 text (byte {e.start})") from None


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_STRTOL_HEX = re.compile(rb"[ \t\n\v\f\r]*([+-]?)([0-9a-fA-F]+)")  # what strtol(s, &end, 16) reads whole


def process_escapes(text: str, what: str) -> str:
    """common/common.cpp `string_process_escapes`, which llama.cpp applies to -p / -f and -r, and llamactx to
    --stop too (on by default, -e; --no-escape turns it off): \\n \\r \\t \\' \\" \\\\ and \\xHH (one byte)
    are replaced, any other backslash pair is kept. Works on the UTF-8 bytes, as llama.cpp does; CommandError
    (naming `what`) if \\x escapes leave bytes that are not UTF-8."""
    data = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        if data[i] != 0x5C or i + 1 == n:  # not a backslash, or one that ends the text
            out.append(data[i])
            i += 1
            continue
        c = data[i + 1]
        i += 2
        if c in _ESCAPES:
            out += _ESCAPES[c]
            continue
        m = _STRTOL_HEX.fullmatch(data[i : i + 2]) if c == ord("x") and i + 1 < n else None
        if m:  # \x and two characters strtol reads as one number
            out.append((-int(m[2], 16) if m[1] == b"-" else int(m[2], 16)) & 0xFF)
            i += 2
            continue
        out += bytes((0x5C, c))
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CommandError(f"{what}: after escapes (-e), byte {e.start} is not UTF-8 text; --no-escape keeps the "
                           "backslashes") from None


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads for generation (default 2)")
    p.add_argument("-tb", "--threads-batch", type=int, default=0, help="threads for batches (default: -t)")


def add_context(p: argparse.ArgumentParser, n_ctx: int = 4096, engine: bool = False) -> None:
    """The context flags; `engine`: also those of the engine's slots (run, chat, serve)."""
    p.add_argument("-c", "--ctx-size", type=int, default=n_ctx, help=f"context size (default {n_ctx})")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size (default 512)")
    p.add_argument("-ctk", "--cache-type-k", default="f16",
                   help="K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl")
    p.add_argument("-ctv", "--cache-type-v", default="f16",
                   help="V cache type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl")
    p.add_argument("--swa-full", action="store_true",
                   help="full-size cache for sliding-window layers (default: llama_kv_cache_iswa's small one)")
    if engine:
        add_reasoning(p)
        p.add_argument("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", dest="ctx_checkpoints",
                       type=non_negative_int, default=8, metavar="N",
                       help="context checkpoints per slot, so that a recurrent, hybrid or sliding-window model "
                            "(mamba2, lfm2, gemma3) reuses the part of a cached prompt a new one shares (default 8; "
                            "0 = off)")
        p.add_argument("-cms", "--checkpoint-min-step", dest="checkpoint_min_step", type=non_negative_int,
                       default=0, metavar="N",
                       help="least spacing in tokens between the checkpoints taken away from a prompt's end "
                            "(default 0: one before each prompt chunk of -b tokens; llama-server's 8192 spaces the "
                            "ones it takes at user messages, which llamactx does not track)")
        p.add_argument("--session-ram", type=float, default=0, metavar="MiB",
                       help="keep the states of evicted slots in up to this many MiB of RAM, so that a conversation "
                            "whose prompt starts with one resumes without decoding it again (default 0: off)")
        p.add_argument("--session-dir", default=None, metavar="DIR",
                       help="below --session-ram: keep evicted states as files in DIR (several servers may share "
                            "it), bounded by --session-disk")
        p.add_argument("--session-disk", type=float, default=0, metavar="MiB",
                       help="the bound of --session-dir in MiB, least recently used files deleted first")
        p.add_argument("--session-min-tokens", type=non_negative_int, default=64, metavar="N",
                       help="store only states of at least N tokens in the session tier (default 64)")


# llama.cpp's sampling flags (common/arg.cpp): (flags, SamplingParams field, type, help). Each defaults to None:
# only the flags given override SamplingParams' defaults (llama.cpp's). The request field of the same meaning has
# the field's name, except penalty_last_n (llama-server's repeat_last_n).
SAMPLING_FLAGS = (
    (("--temp", "--temperature"), "temperature", float, "temperature (0 = greedy; default 0.8)"),
    (("--top-k",), "top_k", int, "top-k (0 = off; default 40)"),
    (("--top-p",), "top_p", float, "top-p (1 = off; default 0.95)"),
    (("--min-p",), "min_p", float, "min-p (0 = off; default 0.05)"),
    (("--typical", "--typical-p"), "typical_p", float, "locally typical sampling p (1 = off)"),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float, "top-n-sigma (<= 0 = off)"),
    (("--xtc-probability",), "xtc_probability", float, "XTC probability (0 = off)"),
    (("--xtc-threshold",), "xtc_threshold", float, "XTC threshold (default 0.1)"),
    (("--repeat-penalty",), "repeat_penalty", float, "repetition penalty (1 = off)"),
    (("--repeat-last-n",), "penalty_last_n", int, "tokens the penalties look back on (-1 = context; default 64)"),
    (("--presence-penalty",), "presence_penalty", float, "presence penalty (0 = off)"),
    (("--frequency-penalty",), "frequency_penalty", float, "frequency penalty (0 = off)"),
    (("--dry-multiplier",), "dry_multiplier", float, "DRY multiplier (0 = off)"),
    (("--dry-base",), "dry_base", float, "DRY base (default 1.75)"),
    (("--dry-allowed-length",), "dry_allowed_length", int, "DRY allowed length (default 2)"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, "tokens DRY looks back on (-1 = context)"),
    (("--dynatemp-range",), "dynatemp_range", float, "dynamic temperature range (0 = off)"),
    (("--dynatemp-exp",), "dynatemp_exponent", float, "dynamic temperature exponent (default 1)"),
    (("--mirostat",), "mirostat", int, "0 off, 1 Mirostat, 2 Mirostat 2.0"),
    (("--mirostat-lr",), "mirostat_eta", float, "Mirostat learning rate eta (default 0.1)"),
    (("--mirostat-ent",), "mirostat_tau", float, "Mirostat target entropy tau (default 5)"),
    (("--min-keep",), "min_keep", int, "candidates every sampler keeps (default 0)"),
    (("-s", "--seed"), "seed", int, "RNG seed (-1 = random)"),
)


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=-1, help="tokens to generate (-1 = until EOS/full)")
    for flags, field, kind, text in SAMPLING_FLAGS:
        p.add_argument(*flags, dest=field, type=kind, default=None, help=text)
    p.add_argument("--samplers", default=None, help="the sampler order, names separated by ';' "
                   "(default penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)")
    p.add_argument("--sampling-seq", "--sampler-seq", dest="sampling_seq", default=None,
                   help="the sampler order as characters (e.g. edskypmxt)")
    p.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STRING",
                   help="a DRY sequence breaker (repeatable; replaces the defaults; 'none' for none)")
    p.add_argument("--grammar", default=None, help="GBNF grammar text")
    p.add_argument("--grammar-file", default=None, help="file with a GBNF grammar")
    p.add_argument("--json-schema", "-j", default=None, help="JSON schema the output must follow")


def sampling_options(args: argparse.Namespace) -> dict:
    """The sampling flags given, as SamplingParams fields (what `run`, `chat` and `serve` pass on)."""
    out = {field: getattr(args, field) for _, field, _, _ in SAMPLING_FLAGS if getattr(args, field) is not None}
    if args.samplers is not None:
        out["samplers"] = tuple(name for name in args.samplers.split(";") if name)
    if args.sampling_seq is not None:
        out["samplers"] = args.sampling_seq
    if args.dry_sequence_breaker is not None:
        out["dry_sequence_breakers"] = () if args.dry_sequence_breaker == ["none"] else \
            tuple(process_escapes(b, "--dry-sequence-breaker") for b in args.dry_sequence_breaker)
    return out


def add_reasoning(p: argparse.ArgumentParser) -> None:
    """llama-server's thinking flags (common/arg.cpp); what they do is llamactx.chat_parse's."""
    from llamactx.chat_parse.parse_params import REASONING_FORMATS
    p.add_argument("--reasoning-format", default="auto", choices=REASONING_FORMATS,
                   help="none: thinking stays in the content; deepseek / auto: in reasoning_content; "
                        "deepseek-legacy: in both (default auto)")
    p.add_argument("-rea", "--reasoning", default="auto", choices=("on", "off", "auto"),
                   help="thinking on, off, or the template's default (auto)")
    p.add_argument("--reasoning-budget", type=_budget, default=-1, metavar="N",
                   help="token budget for thinking: -1 unrestricted, 0 no thinking, N > 0: after N thinking "
                        "tokens the end-of-thinking tag is forced (default -1)")


def runtime_params(args: argparse.Namespace, **fields):
    """The model, LoRA and context flags (add_common, add_context, add_llama_cpp_flags, add_lora) as the
    RuntimeParams every front end builds from; `fields`: the command's own (n_slots, chat_template...)."""
    from llamactx.runtime import RuntimeParams  # imports the engine and numba: not for --help, info, quantize
    flags = dict(model=args.model, lora=tuple(getattr(args, "lora", ())), spec=spec_params(args), n_ctx=args.ctx_size,
                 n_batch=args.batch_size, n_ubatch=args.ubatch_size, n_threads=args.threads,
                 n_threads_batch=args.threads_batch or args.threads, type_k=args.cache_type_k,
                 type_v=args.cache_type_v, flash_attn=args.flash_attn, swa_full=args.swa_full,
                 n_ctx_checkpoints=args.ctx_checkpoints, checkpoint_min_step=args.checkpoint_min_step,
                 session=session_params(args), **_reasoning_fields(args))
    return RuntimeParams(**{**flags, **fields})


def _budget(value: str) -> int:
    n = int(value)
    if n < -1:
        raise argparse.ArgumentTypeError(f"{n} is below -1 (-1: unrestricted, 0: no thinking)")
    return n


def _reasoning_fields(args: argparse.Namespace) -> dict:
    if not hasattr(args, "reasoning_format"):
        return {}
    return dict(reasoning_format=args.reasoning_format, reasoning_budget=args.reasoning_budget,
                enable_thinking={"on": True, "off": False}.get(args.reasoning))


def session_params(args: argparse.Namespace):
    """The SessionParams of --session-ram / --session-dir / --session-disk (MiB), None when neither level is
    asked for; CommandError for a negative size or a directory without its bound (or the reverse)."""
    from llamactx.engine.session_tier import SessionParams

    if not args.session_ram and args.session_dir is None and not args.session_disk:
        return None
    for flag, value in (("--session-ram", args.session_ram), ("--session-disk", args.session_disk)):
        if not (math.isfinite(value) and value >= 0):
            raise CommandError(f"{flag} = {value} must be a number of MiB >= 0")
    if (args.session_dir is None) != (args.session_disk == 0):
        raise CommandError("--session-dir and --session-disk go together: the disk level needs a directory and a "
                           "bound in MiB > 0")
    if args.session_min_tokens < 1:
        raise CommandError(f"--session-min-tokens = {args.session_min_tokens} must be >= 1")
    mib = 1 << 20
    return SessionParams(ram_bytes=int(args.session_ram * mib), disk_dir=args.session_dir,
                         disk_bytes=int(args.session_disk * mib), min_tokens=args.session_min_tokens)


def flash_attn_type(value: str) -> str:
    """-fa on|off|auto (common/arg.cpp is_truthy / is_falsey / is_autoy) -> ContextParams.flash_attn."""
    for names, mode in ((("on", "enabled", "true", "1"), "enabled"), (("off", "disabled", "false", "0"), "disabled"),
                        (("auto", "-1"), "auto")):
        if value in names:
            return mode
    raise argparse.ArgumentTypeError(f"'{value}' is not on, off or auto")


def gpu_layers_type(value: str) -> str:
    if value in ("auto", "all") or value.lstrip("-").isdigit():
        return value
    raise argparse.ArgumentTypeError(f"'{value}' is not a number, 'auto' or 'all'")


def non_negative_int(value: str) -> int:
    n = int(value) if value.lstrip("-").isdigit() else -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number >= 0")
    return n


# llama.cpp flags that do nothing on this runtime: (args attribute, flag, why), one notice each when given
IGNORED_FLAGS = (
    ("n_gpu_layers", "-ngl/--n-gpu-layers", "llamactx runs on the CPU"),
    ("mlock", "--mlock", "the model is a read-only memory map, not locked in RAM"),
    ("no_mmap", "--no-mmap", "the model is always a read-only memory map"),
    ("no_conversation", "-no-cnv/--no-conversation",
     "`llamactx run` completes text and `llamactx chat` is the conversation"),
)


def add_llama_cpp_flags(p: argparse.ArgumentParser, conversation: bool = False) -> None:
    """-fa (mapped to the context's flash_attn) and the flags accepted with a notice (IGNORED_FLAGS)."""
    p.add_argument("-fa", "--flash-attn", type=flash_attn_type, nargs="?", const="enabled", default="auto",
                   metavar="on|off|auto", help="flash attention (default auto)")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=gpu_layers_type, default=None,
                   metavar="N", help="accepted, ignored: llamactx runs on the CPU")
    p.add_argument("--mlock", action="store_true", help="accepted, ignored: the model is a read-only mmap")
    p.add_argument("--no-mmap", action="store_true", help="accepted, ignored: the model is a read-only mmap")
    if conversation:
        p.add_argument("-no-cnv", "--no-conversation", action="store_true",
                       help="accepted, ignored: run completes text, chat converses")


def notice_ignored(args: argparse.Namespace) -> None:
    """One line on stderr for each IGNORED_FLAGS flag given."""
    for dest, flag, why in IGNORED_FLAGS:
        if dest == "no_conversation" and args.command == "run" and args.system_prompt:
            continue  # here it does something: the -sys notice says what
        if getattr(args, dest, None) not in (None, False):
            print(f"llamactx: {flag} ignored: {why}", file=sys.stderr)


class _LoraAction(argparse.Action):
    """--lora FNAME[,FNAME...] and --lora-scaled FNAME:SCALE[,...] (or FNAME SCALE, older llama.cpp's form) into
    one list of (path, scale) in the order given, as common/arg.cpp fills `lora_adapters`."""

    def __call__(self, parser, namespace, values, option_string=None):
        specs = list(getattr(namespace, self.dest) or [])
        if option_string == "--lora":
            specs += [(item, 1.0) for item in values.split(",") if item]
        elif len(values) == 2 and ":" not in values[0]:
            specs.append((values[0], _lora_scale(values[1], option_string)))
        elif len(values) == 1:
            for item in values[0].split(","):
                path, sep, scale = item.rpartition(":")
                if not sep or not path:
                    raise CommandError(f"{option_string} {item!r}: expected FNAME:SCALE")
                specs.append((path, _lora_scale(scale, option_string)))
        else:
            raise CommandError(f"{option_string}: expected FNAME:SCALE[,...] or FNAME SCALE, got {values}")
        setattr(namespace, self.dest, specs)


def _lora_scale(text: str, flag: str) -> float:
    try:
        scale = float(text)
    except ValueError:
        raise CommandError(f"{flag}: scale {text!r} is not a number") from None
    if not math.isfinite(scale):
        raise CommandError(f"{flag}: scale {text!r} is not a finite number")
    return scale


def add_lora(p: argparse.ArgumentParser) -> None:
    """LoRA adapters (llama.cpp's GGUF LoRA files): args.lora = [(path, scale), ...]."""
    p.add_argument("--lora", dest="lora", action=_LoraAction, default=[], metavar="FNAME",
                   help="LoRA adapter at scale 1 (comma-separated or repeated for several)")
    p.add_argument("--lora-scaled", dest="lora", action=_LoraAction, nargs="+", metavar="FNAME:SCALE",
                   help="LoRA adapter with a scale: FNAME:SCALE[,...] (or FNAME SCALE); repeatable")


POOLING_TYPES = ("none", "mean", "cls", "last", "rank")  # llama.cpp's --pooling (enum llama_pooling_type)


def add_pooling(p: argparse.ArgumentParser) -> None:
    """--pooling {none,mean,cls,last,rank} (common/arg.cpp): how embeddings are pooled; absent (None): the
    model's own `<arch>.pooling_type` (mean for a model without one)."""
    p.add_argument("--pooling", choices=POOLING_TYPES, default=None,
                   help="embedding pooling (default: the model's pooling_type, else mean; none: one vector per "
                        "token, which the embeddings endpoints refuse; rank: a reranker's score)")


def add_escape(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--escape", action="store_true", default=True,
                   help="process escapes (\\n \\t \\xHH ...) in the prompt and -r / --stop (the default)")
    p.add_argument("--no-escape", dest="escape", action="store_false", help="take backslashes literally")


def add_generation(p: argparse.ArgumentParser) -> None:
    """run and chat: where generation stops, and what else it prints."""
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="TEXT",
                   help="stop at TEXT: run prints it (llama-completion), chat hands the turn back; repeatable")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at TEXT, not printed; repeatable")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at an end-of-generation token")
    p.add_argument("--context-shift", action="store_true",
                   help="when the context is full, drop half of it and go on (default: stop)")
    p.add_argument("--n-probs", type=non_negative_int, default=0, metavar="N",
                   help="after the text, each token's probability and the N most likely tokens")
    p.add_argument("-sys", "--system-prompt", default=None,
                   help="system prompt (run: -p becomes the user's turn of one chat exchange)")
    add_escape(p)


# -- speculative decoding: llama-server's --spec-* flags (common/arg.cpp) -------------------------------------------

# (flag, SpecParams field or (NgramParams field of SpecParams, its field), type, lowest, highest, help)
SPEC_FLAGS = (
    ("--spec-draft-n-max", "n_max", int, 0, None, "draft tokens at most (draft models; default 3)"),
    ("--spec-draft-n-min", "n_min", int, 0, None, "draft tokens at least (draft models; default 0)"),
    ("--spec-draft-p-min", "p_min", float, 0.0, 1.0, "minimum draft probability, greedy (draft models; default 0)"),
    ("--spec-ngram-simple-size-n", ("ngram_simple", "size_n"), int, 1, 1024, "ngram-simple: lookup n-gram (12)"),
    ("--spec-ngram-simple-size-m", ("ngram_simple", "size_m"), int, 1, 1024, "ngram-simple: draft m-gram (48)"),
    ("--spec-ngram-simple-min-hits", ("ngram_simple", "min_hits"), int, 1, None, "ngram-simple: minimum hits (1)"),
    ("--spec-ngram-map-k-size-n", ("ngram_map_k", "size_n"), int, 1, 1024, "ngram-map-k: lookup n-gram (12)"),
    ("--spec-ngram-map-k-size-m", ("ngram_map_k", "size_m"), int, 1, 1024, "ngram-map-k: draft m-gram (48)"),
    ("--spec-ngram-map-k-min-hits", ("ngram_map_k", "min_hits"), int, 1, None, "ngram-map-k: minimum hits (1)"),
    ("--spec-ngram-mod-n-match", "ngram_mod_n_match", int, 1, 1024, "ngram-mod: lookup length (24)"),
    ("--spec-ngram-mod-n-min", "ngram_mod_n_min", int, 0, 1024, "ngram-mod: draft tokens at least (48)"),
    ("--spec-ngram-mod-n-max", "ngram_mod_n_max", int, 0, 1024, "ngram-mod: draft tokens at most (64)"),
    ("--spec-free-rows", "free_rows", int, 0, 1 << 16, "llamactx: rows a decode holds for about the cost of one, "
     "until the draft budget has measured this machine's decodes; a draft token is verified only if it is likely "
     "to pay (8; 0: verify whole drafts, as llama.cpp)"),
)
# flags llama.cpp removed, refused with its message (arg.cpp `arg_removed`)
REMOVED_SPEC_FLAGS = (
    (("--draft", "--draft-n", "--draft-max"), "--spec-draft-n-max or --spec-ngram-mod-n-max"),
    (("--draft-min", "--draft-n-min"), "--spec-draft-n-min or --spec-ngram-mod-n-min"),
    (("--spec-ngram-size-n",), "the respective --spec-ngram-*-size-n"),
    (("--spec-ngram-size-m",), "the respective --spec-ngram-*-size-m"),
    (("--spec-ngram-min-hits",), "the respective --spec-ngram-*-min-hits"),
)


def _ranged(kind, lo, hi):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a{'n integer' if kind is int else ' number'}") from None
        if value < lo or (hi is not None and value > hi) or value != value:
            raise argparse.ArgumentTypeError(f"{text} is outside [{lo}, {hi if hi is not None else 'inf'}]")
        return value
    return parse


class _Removed(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        raise CommandError(f"{option_string}: the argument has been removed. use {self.default}")


def add_speculative(p: argparse.ArgumentParser) -> None:
    """Speculative decoding's flags, llama-server's names and ranges; `spec_params(args)` makes the SpecParams."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-type", action="append", default=None, metavar="TYPES",
                   help="comma-separated: none, ngram-simple, ngram-map-k, ngram-mod, draft-simple, and llamactx's "
                        "ngram-backoff (ngram-simple's sizes; shorter keys, loops drafted through) (default none)")
    g.add_argument("--spec-draft-model", "-md", "--model-draft", dest="spec_draft_model", default=None,
                   metavar="FNAME", help="draft model for --spec-type draft-simple (same vocabulary as -m)")
    for flag, field, kind, lo, hi, text in SPEC_FLAGS:
        dest = "spec_" + (field if isinstance(field, str) else "_".join(field))
        g.add_argument(flag, dest=dest, type=_ranged(kind, lo, hi), default=None, metavar="N", help=text)
    for flags, use in REMOVED_SPEC_FLAGS:
        g.add_argument(*flags, action=_Removed, default=use, metavar="N", help=argparse.SUPPRESS)


def spec_params(args: argparse.Namespace):
    """The SpecParams of the --spec-* flags given (their defaults otherwise), None without --spec-type; a type
    llamactx does not know or support, or draft-simple without a draft model, is a CommandError. A draft model
    without draft-simple is not used, as in llama-server 0c1e570 (said on stderr)."""
    from llamactx.embedded import resolve_model_path
    from llamactx.engine.speculative import NgramParams, SpecParams, SpecParamsError

    draft = getattr(args, "spec_draft_model", None)
    types = tuple(t.strip() for value in args.spec_type or () for t in value.split(",") if t.strip())
    if draft is not None and "draft-simple" not in types:
        print("llamactx: --spec-draft-model unused: speculation with a draft model needs --spec-type draft-simple",
              file=sys.stderr)
    if not types:
        return None
    if draft is not None and "draft-simple" in types:
        try:
            top: dict = {"draft_model": str(resolve_model_path(draft))}
        except OSError as e:
            raise CommandError(f"--spec-draft-model: {e}") from None
    else:
        top = {}
    nested: dict[str, dict] = {"ngram_simple": {}, "ngram_map_k": {}}
    for _, field, _, _, _, _ in SPEC_FLAGS:
        value = getattr(args, "spec_" + (field if isinstance(field, str) else "_".join(field)))
        if value is not None and isinstance(field, str):
            top[field] = value
        elif value is not None:
            nested[field[0]][field[1]] = value
    try:
        return SpecParams(types=types, **top, **{k: NgramParams(**v) for k, v in nested.items()})
    except SpecParamsError as e:
        raise CommandError(f"--spec-type: {e}") from None
