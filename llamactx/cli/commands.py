"""The `llamactx` command line (also `python -m llamactx`), with llama.cpp's flag names.

    llamactx run -p TEXT [-n 128] [--temp 0.8] ...   stream a completion (llama-cli / llama-completion)
    llamactx chat                                     interactive chat with the model's template
    llamactx bench -p 512 -n 128 -r 3 [-o json]       llama-bench's pp / tg tests
    llamactx perplexity -f FILE -c 512                llama-perplexity
    llamactx embedding -p TEXT [--embd-output-format json]   llama-embedding (mean pooling)
    llamactx quantize IN.gguf OUT.gguf Q4_K_M         llama-quantize (F16, Q8_0, Q4_x, Q5_x, the K-quant mixes)
    llamactx imatrix -f FILE [-c 512] [-o imatrix.gguf]   llama-imatrix (quantize --imatrix reads it)
    llamactx gguf-split [--merge] IN OUT               llama-gguf-split (byte-identical files)
    llamactx serve [-np 4] [-c 4096] [--port 8080]    llama-server: OpenAI-compatible API and chat page
    llamactx tokenize -p TEXT | info | --version

`-m` takes a GGUF path or an embedded model name (smollm2, gemma3); omitted, the default model (SmolLM2).
llama.cpp flags that do not apply here (-ngl, --mlock, --no-mmap, -no-cnv) are accepted with a one-line notice.
run, chat, serve, perplexity and embedding take LoRA adapters: --lora FILE[,FILE...], --lora-scaled FILE:SCALE[,...].
"""

from __future__ import annotations

import argparse
import math
import sys

from llamactx.cli.args import (
    ArgumentParser,
    CommandError,
    add_common,
    add_context,
    add_escape,
    add_generation,
    add_llama_cpp_flags,
    add_lora,
    add_pooling,
    add_sampling,
    add_speculative,
    notice_ignored,
    process_escapes,
    read_text,
    runtime_params,
    sampling_options,
)
from llamactx.cli.bench import add_arguments as add_bench_arguments
from llamactx.embedded import ModelNotInstalledError
from llamactx.errors import LlamactxError
from llamactx.version import LLAMA_CPP_BUILD, __version__

EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as llama.cpp's tools exit


def _prompt(args) -> str:
    """The prompt of -f or -p, escapes processed unless --no-escape (llama.cpp does both)."""
    text = read_text(args.file, "prompt file") if args.file else args.prompt
    if text is None:
        raise CommandError(f"{args.command} needs a prompt: -p TEXT or -f FILE")
    return process_escapes(text, "prompt") if args.escape else text


def _model(args, vocab_only: bool = False):
    from llamactx.embedded import resolve_model_path
    from llamactx.model import Model

    return Model.load(resolve_model_path(args.model), vocab_only=vocab_only)


def _warm_up_notice() -> None:
    from llamactx.ggml.kernels import cache_is_warm

    if not cache_is_warm():
        print("llamactx: first run: compiling kernels (cached for later runs)...", file=sys.stderr, flush=True)


def _llm(args):
    from llamactx.llm import LLM

    if args.n_predict < -1:
        raise CommandError(f"-n / --n-predict = {args.n_predict} must be >= -1 (-1 = until EOS or a full context)")
    _warm_up_notice()
    return LLM.from_params(runtime_params(args))


def _sampling(args) -> dict:
    options = sampling_options(args)
    if args.grammar_file:
        options["grammar"] = read_text(args.grammar_file, "grammar file")
    elif args.grammar:
        options["grammar"] = args.grammar
    if args.json_schema:
        options["json_schema"] = args.json_schema
    return options


def _stops(args) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(-r reverse prompts, --stop strings), escapes processed unless --no-escape."""
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
    from llamactx.cli.bench import expand_tests, run_bench

    expand_tests(args)  # bad flags fail before the model loads
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
    from llamactx.ggml.cpu import ISA_FEATURES
    from llamactx.ggml.kernels import active_path, arithmetic, check_target, cpu_features

    check_target()
    model = _model(args)
    print(model.card())
    print(f"memory:         {model.memory_description(args.swa_full)}")
    feats = cpu_features()
    isa = [f for f in ISA_FEATURES if feats[f]]
    arith = arithmetic()
    print(f"target:         {feats['cpu']} ({' '.join(isa) or 'no AVX'}; NUMBA_CPU_NAME / NUMBA_CPU_FEATURES set it)")
    print(f"kernels:        {active_path()} path")
    print(f"arithmetic:     {arith['variant']} (ggml's float vectors of {arith['f32_epr']} lanes"
          f"{'; f16 flash accumulator in half precision' if arith['fp16_accumulator'] else ''})")
    print(f"logits equal:   llama.cpp {LLAMA_CPP_BUILD} built with {arith['build']}")
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    model = _model(args, vocab_only=True)  # llama-tokenize: any architecture llama.cpp names, graph or not
    tokens = model.vocab.tokenize(args.prompt, add_special=not args.no_bos, parse_special=True)
    for t in tokens:
        print(f"{t:6d} -> {model.vocab.token_to_piece(t, special=True).decode('utf-8', 'replace')!r}")
    print(f"{len(tokens)} tokens")
    return 0


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
        add_common(p)
        add_context(p, engine=True)
        add_sampling(p)
        add_generation(p)
        add_llama_cpp_flags(p, conversation=True)
        add_lora(p)
        add_speculative(p)

    bench = sub.add_parser("bench", help="llama-bench: prompt processing (pp) and generation (tg) speed")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    from llamactx.cli.perplexity import add_arguments as add_perplexity_arguments

    ppl = sub.add_parser("perplexity", help="llama-perplexity over a text file")
    ppl.add_argument("-f", "--file", help="the text to evaluate (not read with --kl-divergence)")
    ppl.add_argument("--chunks", type=int, default=-1, help="max chunks (-1 = all)")
    add_perplexity_arguments(ppl)
    add_common(ppl)
    add_context(ppl, n_ctx=512)
    add_llama_cpp_flags(ppl)
    add_lora(ppl)
    ppl.set_defaults(func=cmd_perplexity)

    from llamactx.cli.embedding import add_parser as add_embedding
    from llamactx.cli.quantize import add_parser as add_quantize

    emb = add_embedding(sub)
    add_common(emb)
    add_context(emb)
    add_escape(emb)
    add_llama_cpp_flags(emb)
    add_lora(emb)
    add_pooling(emb)
    emb.set_defaults(func=cmd_embedding)
    add_quantize(sub).set_defaults(func=cmd_quantize)
    from llamactx.cli.gguf_split import add_parser as add_gguf_split

    add_gguf_split(sub)
    from llamactx.cli.imatrix import add_parser as add_imatrix

    add_imatrix(sub)

    from llamactx.cli.serve import add_parser as add_serve

    add_serve(sub)

    tok = sub.add_parser("tokenize", help="tokenize a prompt (add_special, parse_special)")
    tok.add_argument("-p", "--prompt", required=True)
    tok.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    tok.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    tok.set_defaults(func=cmd_tokenize)

    info = sub.add_parser("info", help="print the model card, its memory type and the kernel path")
    info.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    info.add_argument("--swa-full", action="store_true", help="the memory with a full-size SWA cache")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user's mistake (a `LlamactxError`, a bad flag or value, a missing file) is one line on
    stderr and exit status 1 (2 for a model that is not installed), never a traceback; Ctrl-C exits 130."""
    try:
        args = build_parser().parse_args(argv)
        notice_ignored(args)
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
