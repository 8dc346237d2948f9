"""`llamactx gguf-split`: llama-gguf-split (tools/gguf-split/gguf-split.cpp), same flags, byte-identical files.

    llamactx gguf-split [--split] [--split-max-tensors N | --split-max-size N(M|G)] [--no-tensor-first-split]
                        [--dry-run] IN.gguf OUT_PREFIX        -> OUT_PREFIX-00001-of-0000n.gguf ...
    llamactx gguf-split --merge [--dry-run] IN-00001-of-0000n.gguf OUT.gguf

The file format and the loading of split models live in llamactx.gguf.split; this module reads the flags and prints
what llama-gguf-split prints.
"""

from __future__ import annotations

import argparse
import sys

from llamactx.cli.args import CommandError
from llamactx.gguf.reader import GGUFFile
from llamactx.gguf.split import merge, parse_split_size, plan_split, write_split


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("gguf-split", help="llama-gguf-split: split a GGUF model into files, or merge them back")
    op = p.add_mutually_exclusive_group()
    op.add_argument("--split", dest="merge", action="store_false", help="split GGUF to multiple GGUF (default)")
    op.add_argument("--merge", dest="merge", action="store_true", help="merge multiple GGUF to a single GGUF")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--split-max-tensors", type=int, default=None, metavar="N",
                      help="max tensors in each split (default: 128)")
    mode.add_argument("--split-max-size", default=None, metavar="N(M|G)", help="max size per split")
    p.add_argument("--no-tensor-first-split", action="store_true",
                   help="do not add tensors to the first split")
    p.add_argument("--dry-run", action="store_true",
                   help="only print out a split plan and exit, without writing any new files")
    p.add_argument("input", metavar="GGUF_IN")
    p.add_argument("output", metavar="GGUF_OUT")
    p.set_defaults(func=run_gguf_split, merge=False)
    return p


def run_gguf_split(args: argparse.Namespace) -> int:
    if args.merge:
        if args.split_max_tensors is not None or args.split_max_size is not None or args.no_tensor_first_split:
            raise CommandError("gguf-split: --split-max-tensors, --split-max-size and --no-tensor-first-split "
                               "apply to --split, not --merge")
        if args.dry_run:
            print(f"gguf_merge: {args.input} -> {args.output} (dry run: nothing written)", file=sys.stderr)
            return 0
        n = merge(args.input, args.output, log=lambda m: print(f"gguf_merge: {m}", file=sys.stderr))
        print(f"gguf_merge: {args.output} merged with {n} tensors.", file=sys.stderr)
        return 0
    if args.split_max_tensors is not None and args.split_max_tensors < 1:
        raise CommandError(f"gguf-split: --split-max-tensors {args.split_max_tensors} must be at least 1")
    max_bytes = parse_split_size(args.split_max_size) if args.split_max_size is not None else None
    with GGUFFile(args.input) as gguf:
        plan = plan_split(gguf, max_tensors=args.split_max_tensors or 128, max_bytes=max_bytes,
                          no_tensor_first_split=args.no_tensor_first_split)
        print(f"n_split: {plan.n_split}")
        for i, names in enumerate(plan.parts):
            size = sum(gguf.tensors[n].nbytes for n in names)
            print(f"split {i + 1:05d}: n_tensors = {len(names)}, total_size = {size // 1000 // 1000}M")
        if not args.dry_run:
            write_split(gguf, plan, args.output, log=lambda m: print(m, flush=True))
    print(f"gguf_split: {plan.n_split} gguf split written with a total of {len(gguf.tensors)} tensors.",
          file=sys.stderr)
    return 0
