"""The `llamactx` command line (also `python -m llamactx`), with llama.cpp's flag names.

    llamactx run -p TEXT [-n 128] [--temp 0.8] ...   stream a completion (llama-cli / llama-completion)
    llamactx chat                                     interactive chat with the model's template
    llamactx bench -p 512 -n 128 -r 3 [-o json]       llama-bench's pp / tg tests
    llamactx perplexity -f FILE -c 512                llama-perplexity
    llamactx serve [-np 4] [-c 4096] [--port 8080]    llama-server: OpenAI-compatible API and chat page
    llamactx tokenize -p TEXT | info

`-m` takes a GGUF path or an embedded model name (smollm2, gemma3); omitted, the default model (SmolLM2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamactx.embedded import ModelNotInstalledError
from llamactx.errors import LlamactxError


class CommandError(LlamactxError, ValueError):
    """A command-line argument or input file that cannot be used; printed as one line, exit status 1."""


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
               type_k=args.cache_type_k, type_v=args.cache_type_v)


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


def cmd_run(args: argparse.Namespace) -> int:
    if args.file:
        args.prompt = read_text(args.file, "prompt file")
    if args.prompt is None:
        raise CommandError("run needs a prompt: -p TEXT or -f FILE")
    llm = _llm(args)
    stream = llm.complete(args.prompt, max_tokens=args.n_predict, stream=True, **_sampling(args))
    if args.verbose_prompt:
        sys.stdout.write(args.prompt)
    for chunk in stream:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    t = llm.result.timings
    print(f"\nprompt: {t.prompt_n} tokens, {t.prompt_per_second:.1f} t/s; generation: {t.predicted_n} tokens, "
          f"{t.predicted_per_second:.1f} t/s", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from llamactx.cli.chat import run_chat

    return run_chat(_llm(args), _sampling(args), args.n_predict, args.system_prompt)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamactx", description="llama.cpp's runtime, in Python.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream a completion of a prompt")
    run.add_argument("-p", "--prompt", default=None)
    run.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    run.add_argument("--verbose-prompt", action="store_true", help="print the prompt before the completion")
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="interactive chat (/clear, /save FILE, /load FILE, /exit)")
    chat.add_argument("-sys", "--system-prompt", default=None)
    chat.set_defaults(func=cmd_chat)

    for p in (run, chat):
        _common(p)
        _context(p)
        _sampling_args(p)

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
    ppl.set_defaults(func=cmd_perplexity)

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
    """Run one command. A user's mistake (a `LlamactxError`, a bad value, a missing file) is one line on stderr
    and exit status 1 (2 for a model that is not installed), never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModelNotInstalledError as e:
        print(f"llamactx: {e}", file=sys.stderr)
        return 2
    except (LlamactxError, OSError, ValueError) as e:
        print(f"llamactx: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
