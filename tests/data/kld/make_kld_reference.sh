#!/bin/sh
# llama-perplexity 0c1e570's --kl-divergence-base / --kl-divergence on SmolLM2-135M-Instruct Q4_1 (tests/cli/test_kld.py).
# The base run: -fa off, 3 chunks of 128 tokens of gpl3_head.txt; the second run reads that file with the default
# -fa (auto: flash attention on), so that the two distributions differ. base_<variant>.json keeps the base file's
# sha256 (18.6 MB, not stored) and its perplexity lines; kld_<variant>.txt the second run's stdout from its table on.
# avx2: the native llama-perplexity binary with the AVX2 build's ggml / llama libraries first on LD_LIBRARY_PATH
# (the tool's own code is plain x86-64, no FMA: the same in both builds).
# usage: make_kld_reference.sh MODEL.gguf VARIANT(avx512|avx2)
set -e
M=$1; V=$2; B=~/.cache/llamactx-llamacpp/bin; D=$(dirname "$0")
[ "$V" = avx2 ] && export LD_LIBRARY_PATH=~/.cache/llamactx-llamacpp/avx2/bin
T=$(mktemp -d)
$B/llama-perplexity -m "$M" -f "$D/../gpl3_head.txt" -c 128 -b 128 --chunks 3 -t 2 -fa off \
    --kl-divergence-base "$T/base.bin" > "$T/base.out" 2> "$T/base.err"
$B/llama-perplexity -m "$M" -c 128 -b 128 -t 2 --kl-divergence-base "$T/base.bin" --kl-divergence > "$T/kld.out"
python3 - "$T" "$D" "$V" <<'PY'
import hashlib, json, re, sys
t, d, v = sys.argv[1:]
out = open(f"{t}/kld.out", encoding="utf-8").read()
open(f"{d}/kld_{v}.txt", "w", encoding="utf-8").write(out[out.index("chunk "):].rstrip("\n") + "\n")
data = open(f"{t}/base.bin", "rb").read()
json.dump({"base_sha256": hashlib.sha256(data).hexdigest(), "base_size": len(data),
           "chunks": re.search(r"(\[1\].*,)", open(f"{t}/base.out").read()).group(1),
           "final": re.search(r"Final estimate: PPL = [0-9.]+ \+/- [0-9.]+", open(f"{t}/base.err").read()).group(0)},
          open(f"{d}/base_{v}.json", "w"), indent=1)
PY
rm -r "$T"
