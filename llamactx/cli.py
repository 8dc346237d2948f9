"""The `llamactx` command line (also `python -m llamactx`).

    llamactx info [-m MODEL]                 the model card
    llamactx tokenize [-m MODEL] -p TEXT     token ids and pieces

`-m` takes a GGUF path or an embedded model name (smollm2, gemma3); omitted, the default model (SmolLM2).
"""

from __future__ import annotations

import argparse
import sys

from llamactx.embedded import ModelNotInstalledError, resolve_model_path


def _load(name: str | None):
    from llamactx.model import Model

    return Model.load(resolve_model_path(name))


def cmd_info(args: argparse.Namespace) -> int:
    model = _load(args.model)
    print(model.card())
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    model = _load(args.model)
    tokens = model.vocab.tokenize(args.prompt, add_special=not args.no_bos, parse_special=True)
    for t in tokens:
        print(f"{t:6d} -> {model.vocab.token_to_piece(t, special=True).decode('utf-8', 'replace')!r}")
    print(f"{len(tokens)} tokens")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamactx", description="llama.cpp's runtime, in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print the model card")
    info.set_defaults(func=cmd_info)
    tok = sub.add_parser("tokenize", help="tokenize a prompt (add_special, parse_special)")
    tok.add_argument("-p", "--prompt", required=True)
    tok.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    tok.set_defaults(func=cmd_tokenize)
    for p in (info, tok):
        p.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModelNotInstalledError as e:
        print(f"llamactx: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"llamactx: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
