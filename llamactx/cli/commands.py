"""The `llamactx` command line (also `python -m llamactx`), with llama.cpp's flag names.

    llamactx run -p TEXT [-n 128] [--temp 0.8] ...   stream a completion (llama-cli / llama-completion)
    llamactx chat                                     interactive chat with the model's template
    llamactx bench -p 512 -n 128 -r 3 [-o json]       llama-bench's pp / tg tests
    llamactx perplexity -f FILE -c 512                llama-perplexity
    llamactx embedding -p TEXT [--embd-output-format json]   llama-embedding (mean pooling)
    llamactx quantize IN.gguf OUT.gguf Q4_0           llama-quantize (F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
    llamactx serve [-np 4] [-c 4096] [--port 8080]    llama-server: OpenAI-compatible API and chat page
    llamactx tokenize -p TEXT | info | --version

`-m` takes a GGUF path or an embedded model name (smollm2, gemma3); omitted, the default model (SmolLM2).
llama.cpp flags that do not apply here (-ngl, --mlock, --no-mmap, -no-cnv) are accepted with a one-line notice.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from llamactx import __version__
from llamactx.embedded import ModelNotInstalledError
from llamactx.errors import LlamactxError

LLAMA_CPP_BUILD = "0c1e570"  # the llama.cpp build whose logits llamactx reproduces (tests/data/REFERENCE.md)
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as llama.cpp's tools exit


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
    """common/common.cpp `string_process_escapes`, which llama.cpp applies to -p / -f, -r (on by default, -e;
    --no-escape turns it off): \\n \\r \\t \\' \\" \\\\ and \\xHH (one byte) are replaced, any other backslash
    pair is kept. Works on the UTF-8 bytes, as llama.cpp does; CommandError (naming `what`) if \\x escapes leave
    bytes that are not UTF-8."""
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


def _prompt(args) -> str:
    """The prompt of -f or -p, escapes processed unless --no-escape (llama.cpp does both)."""
    text = read_text(args.file, "prompt file") if args.file else args.prompt
    if text is None:
        raise CommandError(f"{args.command} needs a prompt: -p TEXT or -f FILE")
    return process_escapes(text, "prompt") if args.escape else text


def _model(args):
    from llamactx.embedded import resolve_model_path
    from llamactx.model import Model

    return Model.load(resolve_model_path(args.model))


def _warm_up_notice() -> None:
    from llamactx.ggml.kernels import cache_is_warm

    if not cache_is_warm():
        print("llamactx: first run: compiling kernels (cached for later runs)...", file=sys.stderr, flush=True)


def _llm(args):
    from llamactx.llm import LLM

    if args.n_predict < -1:
        raise CommandError(f"-n / --n-predict = {args.n_predict} must be >= -1 (-1 = until EOS or a full context)")
    _warm_up_notice()
    return LLM(_model(args), n_ctx=args.ctx_size, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
               n_threads=args.threads, n_threads_batch=args.threads_batch or args.threads,
               type_k=args.cache_type_k, type_v=args.cache_type_v, flash_attn=args.flash_attn)


def _sampling(args) -> dict:
    options = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                   repeat_penalty=args.repeat_penalty, seed=args.seed)
    if args.grammar_file:
        options["grammar"] = read_text(args.grammar_file, "grammar file")
    elif args.grammar:
        options["grammar"] = args.grammar
    if args.json_schema:
        options["json_schema"] = args.json_schema
    return options


def _stops(args) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(-r reverse prompts, --stop strings), escapes processed unless --no-escape."""
    if args.n_probs < 0:  # checked here, before the model loads, with the other text flags
        raise CommandError(f"--n-probs = {args.n_probs} must be >= 0 (0 = none)")
    out = []
    for flag, texts in (("-r / --reverse-prompt", args.reverse_prompt), ("--stop", args.stop)):
        if any(t == "" for t in texts):
            raise CommandError(f"{flag}: an empty string would stop before the first token")
        out.append(tuple(process_escapes(t, flag) if args.escape else t for t in texts))
    return out[0], out[1]


def _options(args, llm, stops: tuple[str, ...]) -> dict:
    """LLM.complete's keywords for run / chat: sampling, grammar, stop strings, --ignore-eos, --context-shift,
    --n-probs."""
    options = _sampling(args)
    if stops:
        options["stop"] = stops
    if args.ignore_eos:  # common.cpp common_init_from_params: each end-of-generation token gets logit bias -inf
        options["logit_bias"] = [(t, -math.inf) for t in sorted(llm.model.vocab.eog_ids)]
    options["context_shift"] = args.context_shift
    if args.n_probs:
        options["n_probs"] = args.n_probs
    return options


def cmd_run(args: argparse.Namespace) -> int:
    from llamactx.cli.completion import run_completion

    prompt = _prompt(args)
    system_prompt = args.system_prompt
    if system_prompt and args.no_conversation:  # llama-completion -no-cnv: the prompt as is, no template
        print("llamactx: -sys ignored: -no-cnv keeps the prompt a plain completion", file=sys.stderr)
        system_prompt = None
    reverse, stop = _stops(args)
    llm = _llm(args)
    return run_completion(llm, prompt, _options(args, llm, reverse + stop), args.n_predict, system_prompt,
                          reverse, args.verbose_prompt)


def cmd_chat(args: argparse.Namespace) -> int:
    from llamactx.cli.chat import run_chat

    reverse, stop = _stops(args)
    llm = _llm(args)
    return run_chat(llm, _options(args, llm, reverse + stop), args.n_predict, args.system_prompt)


def cmd_bench(args: argparse.Namespace) -> int:
    from llamactx.cli.bench import run_bench

    if args.n_prompt < 0 or args.n_gen < 0 or not (args.n_prompt or args.n_gen):
        raise CommandError(f"bench: nothing to measure with -p {args.n_prompt} -n {args.n_gen} (give -p and/or -n > 0)")
    if args.repetitions < 1:
        raise CommandError(f"bench: -r {args.repetitions} must be >= 1")
    _warm_up_notice()
    return run_bench(_model(args), args)


def cmd_perplexity(args: argparse.Namespace) -> int:
    from llamactx.cli.perplexity import run_perplexity

    _warm_up_notice()
    return run_perplexity(_model(args), args)


def cmd_embedding(args: argparse.Namespace) -> int:
    from llamactx.cli.embedding import run_embedding

    prompt = _prompt(args)
    _warm_up_notice()
    return run_embedding(_model(args), prompt, args)


def cmd_quantize(args: argparse.Namespace) -> int:
    from llamactx.cli.quantize import run_quantize

    return run_quantize(args)


def cmd_info(args: argparse.Namespace) -> int:
    from llamactx.ggml.kernels import active_path, cpu_features

    print(_model(args).card())
    feats = cpu_features()
    print(f"kernels:        {active_path()} path (cpu {feats.get('cpu', '?')}, "
          f"avx512-vnni {'yes' if feats.get('vnni') else 'no'})")
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    model = _model(args)
    tokens = model.vocab.tokenize(args.prompt, add_special=not args.no_bos, parse_special=True)
    for t in tokens:
        print(f"{t:6d} -> {model.vocab.token_to_piece(t, special=True).decode('utf-8', 'replace')!r}")
    print(f"{len(tokens)} tokens")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads for generation (default 2)")
    p.add_argument("-tb", "--threads-batch", type=int, default=0, help="threads for batches (default: -t)")


def _context(p: argparse.ArgumentParser, n_ctx: int = 4096) -> None:
    p.add_argument("-c", "--ctx-size", type=int, default=n_ctx, help=f"context size (default {n_ctx})")
    p.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size (default 512)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache type: f32, f16, q8_0, q4_0")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type: f32, f16, q8_0, q4_0")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=-1, help="tokens to generate (-1 = until EOS/full)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=-1, help="RNG seed (-1 = random)")
    p.add_argument("--grammar", default=None, help="GBNF grammar text")
    p.add_argument("--grammar-file", default=None, help="file with a GBNF grammar")
    p.add_argument("--json-schema", "-j", default=None, help="JSON schema the output must follow")


def _flash_attn(value: str) -> str:
    """-fa on|off|auto (common/arg.cpp is_truthy / is_falsey / is_autoy) -> ContextParams.flash_attn."""
    for names, mode in ((("on", "enabled", "true", "1"), "enabled"), (("off", "disabled", "false", "0"), "disabled"),
                        (("auto", "-1"), "auto")):
        if value in names:
            return mode
    raise argparse.ArgumentTypeError(f"'{value}' is not on, off or auto")


def _gpu_layers(value: str) -> str:
    if value in ("auto", "all") or value.lstrip("-").isdigit():
        return value
    raise argparse.ArgumentTypeError(f"'{value}' is not a number, 'auto' or 'all'")


# llama.cpp flags that do nothing on this runtime: (args attribute, flag, why), one notice each when given
IGNORED_FLAGS = (
    ("n_gpu_layers", "-ngl/--n-gpu-layers", "llamactx runs on the CPU"),
    ("mlock", "--mlock", "the model is a read-only memory map, not locked in RAM"),
    ("no_mmap", "--no-mmap", "the model is always a read-only memory map"),
    ("no_conversation", "-no-cnv/--no-conversation",
     "`llamactx run` completes text and `llamactx chat` is the conversation"),
)


def _llama_cpp_flags(p: argparse.ArgumentParser, conversation: bool = False) -> None:
    """-fa (mapped to the context's flash_attn) and the flags accepted with a notice (IGNORED_FLAGS)."""
    p.add_argument("-fa", "--flash-attn", type=_flash_attn, nargs="?", const="enabled", default="auto",
                   metavar="on|off|auto", help="flash attention (default auto)")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=_gpu_layers, default=None,
                   metavar="N", help="accepted, ignored: llamactx runs on the CPU")
    p.add_argument("--mlock", action="store_true", help="accepted, ignored: the model is a read-only mmap")
    p.add_argument("--no-mmap", action="store_true", help="accepted, ignored: the model is a read-only mmap")
    if conversation:
        p.add_argument("-no-cnv", "--no-conversation", action="store_true",
                       help="accepted, ignored: run completes text, chat converses")


def _notice_ignored(args: argparse.Namespace) -> None:
    for dest, flag, why in IGNORED_FLAGS:
        if dest == "no_conversation" and args.command == "run" and args.system_prompt:
            continue  # here it does something: the -sys notice says what
        if getattr(args, dest, None) not in (None, False):
            print(f"llamactx: {flag} ignored: {why}", file=sys.stderr)


def _escape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--escape", action="store_true", default=True,
                   help="process escapes (\\n \\t \\xHH ...) in the prompt and -r / --stop (the default)")
    p.add_argument("--no-escape", dest="escape", action="store_false", help="take backslashes literally")


def _generation_args(p: argparse.ArgumentParser) -> None:
    """run and chat: where generation stops, and what else it prints."""
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="TEXT",
                   help="stop at TEXT, printed (chat: hand the turn back); repeatable")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at TEXT, not printed; repeatable")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at an end-of-generation token")
    p.add_argument("--context-shift", action="store_true",
                   help="when the context is full, drop half of it and go on (default: stop)")
    p.add_argument("--n-probs", type=int, default=0, metavar="N",
                   help="after the text, each token's probability and the N most likely tokens")
    p.add_argument("-sys", "--system-prompt", default=None,
                   help="system prompt (run: -p becomes the user's turn of one chat exchange)")
    _escape_args(p)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="llamactx", description="llama.cpp's runtime, in Python.")
    parser.add_argument("--version", action="version",
                        version=f"llamactx {__version__} (logits follow llama.cpp build {LLAMA_CPP_BUILD})")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream a completion of a prompt (llama-completion)")
    run.add_argument("-p", "--prompt", default=None)
    run.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    run.add_argument("--verbose-prompt", action="store_true", help="print the prompt before the completion")
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="interactive chat (/clear, /save FILE, /load FILE, /exit)")
    chat.set_defaults(func=cmd_chat)

    for p in (run, chat):
        _common(p)
        _context(p)
        _sampling_args(p)
        _generation_args(p)
        _llama_cpp_flags(p, conversation=True)

    bench = sub.add_parser("bench", help="llama-bench: prompt processing (pp) and generation (tg) speed")
    bench.add_argument("-p", "--n-prompt", type=int, default=512)
    bench.add_argument("-n", "--n-gen", type=int, default=128)
    bench.add_argument("-r", "--repetitions", type=int, default=5)
    bench.add_argument("-o", "--output", choices=("md", "json"), default="md")
    _common(bench)
    _context(bench)
    bench.set_defaults(func=cmd_bench)

    ppl = sub.add_parser("perplexity", help="llama-perplexity over a text file")
    ppl.add_argument("-f", "--file", required=True)
    ppl.add_argument("--chunks", type=int, default=-1, help="max chunks (-1 = all)")
    _common(ppl)
    _context(ppl, n_ctx=512)
    _llama_cpp_flags(ppl)
    ppl.set_defaults(func=cmd_perplexity)

    from llamactx.cli.embedding import add_parser as add_embedding
    from llamactx.cli.quantize import add_parser as add_quantize

    emb = add_embedding(sub)
    _common(emb)
    _context(emb)
    _escape_args(emb)
    _llama_cpp_flags(emb)
    emb.set_defaults(func=cmd_embedding)
    add_quantize(sub).set_defaults(func=cmd_quantize)

    from llamactx.cli.serve import add_parser as add_serve

    add_serve(sub)

    tok = sub.add_parser("tokenize", help="tokenize a prompt (add_special, parse_special)")
    tok.add_argument("-p", "--prompt", required=True)
    tok.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    tok.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    tok.set_defaults(func=cmd_tokenize)

    info = sub.add_parser("info", help="print the model card and the kernel path")
    info.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user's mistake (a `LlamactxError`, a bad flag or value, a missing file) is one line on
    stderr and exit status 1 (2 for a model that is not installed), never a traceback; Ctrl-C exits 130."""
    try:
        args = build_parser().parse_args(argv)
        _notice_ignored(args)
        return args.func(args)
    except ModelNotInstalledError as e:
        print(f"llamactx: {e}", file=sys.stderr)
        return 2
    except (LlamactxError, OSError, ValueError) as e:
        print(f"llamactx: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nllamactx: interrupted by user", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
