"""Multi-turn chat on `llamactx serve --replicas N`: prefix-affinity routing against round-robin (and, with
--single, the single-process server with one replica's flags: what one replica does alone, without Ray).

32 conversations x 4 turns (by default), C at a time; every turn resends the whole history (a system prompt shared
by all conversations, the conversation's opening message, then each question and answer), greedy, -n tokens per
answer. Reported per routing: the share of prompt tokens served from the replicas' caches (from /metrics, summed
over the replicas), the share of later turns that went to their conversation's previous replica, generated
tokens/s and requests/s over the run, turn latency p50 / p95, the HTTP path's own round trip (a /tokenize of a few
words), the CPU seconds the replicas and the server's other processes (Ray's, the ingress) used during the run,
each replica's memory (RSS, and USS: what is its own, the mmap'd weights being shared page cache) and the USS of
the other processes. Each server is started here (the real CLI: a local Ray on
127.0.0.1, a free port) and stopped with SIGINT, which shuts its Ray down.

Usage: python bench/cluster_bench.py [-m smollm2] [--replicas 2] [-t 1] [-np 16] [-c 16384] [--conversations 32]
           [--turns 4] [--clients 8] [-n 16] [--routing affinity,round-robin] [--single] [--json OUT]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx
import psutil

SYSTEM = ("You are the assistant of a travel agency. Answer briefly and precisely. " + " ".join(
    f"Rule {i}: {rule}." for i, rule in enumerate([
        "quote prices in euros, taxes included", "offer travel insurance once, never twice",
        "trains are preferred to planes for trips under six hundred kilometres",
        "hotel rooms are booked with free cancellation until two days before arrival",
        "a visa check is due for every trip outside the Schengen area",
        "children under twelve travel at half price on partner railways",
        "luggage above twenty-three kilograms costs forty euros on partner airlines",
        "every booking gets a confirmation number of eight characters",
        "group bookings of ten people or more get a dedicated agent",
        "refunds are paid within fourteen days to the original card",
        "the office is open from eight to eight on weekdays and from nine to one on Saturdays",
        "travellers with reduced mobility get assistance at every station and airport when booked two days "
        "ahead", "pets under eight kilograms travel in the cabin for a fee of thirty euros",
        "cruise bookings need a passport valid six months after return",
        "winter sports packages include equipment rental when booked with the hotel"], 1)))
PLACES = ["Lisbon", "Kyoto", "Oslo", "Marrakesh", "Vienna", "Lima", "Hanoi", "Dublin", "Cairo", "Seville",
          "Quebec", "Tallinn", "Naples", "Bergen", "Porto", "Krakow"]
QUESTIONS = ["How should I get there?", "What does the hotel cost?", "Do I need a visa?", "Can I take my dog?",
             "What if I cancel?", "Is insurance included?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, routing: str | None) -> tuple[subprocess.Popen, str]:
    """`llamactx serve` (with --replicas unless `routing` is None), ready; its process and URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "llamactx", "serve", "-m", args.model, "--port", str(port), "--metrics",
           "--no-webui", "-c", str(args.ctx_size)]
    if routing is None:
        cmd += ["-np", str(args.parallel), "-t", str(args.threads)]
    else:
        cmd += ["-np", str(args.parallel), "-t", str(args.threads), "--replicas", str(args.replicas),
                "--routing", routing]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            health = httpx.get(url + "/health", timeout=5)
            if health.status_code == 200 and len(health.json().get("replicas", [None])) == (
                    args.replicas if routing else 1):
                return proc, url
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"the server did not start: {' '.join(cmd)}")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT (Ctrl-C: the server shuts its Ray down), SIGKILL to its process group past 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def totals(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split()
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def conversation(url: str, i: int, n_turns: int, n_gen: int) -> list[tuple[str, float, int]]:
    """Conversation i: (replica, seconds, generated tokens) of each turn."""
    place = PLACES[i % len(PLACES)]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"I am customer {i}. I want to travel to {place} in spring, for "
                                            f"{3 + i % 5} days, with {1 + i % 3} adults."}]
    out = []
    with httpx.Client(base_url=url, timeout=600) as c:
        for t in range(n_turns):
            if t:
                messages.append({"role": "user", "content": QUESTIONS[(i + t) % len(QUESTIONS)]})
            t0 = time.perf_counter()
            r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": n_gen, "temperature": 0})
            r.raise_for_status()
            body = r.json()
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            out.append((r.headers.get("x-llamactx-replica", "single"), time.perf_counter() - t0,
                        body["usage"]["completion_tokens"]))
    return out


def memory(url: str) -> list[dict]:
    """Each replica's RSS and USS in MiB (the pids /health lists; the single process's own without replicas)."""
    health = httpx.get(url + "/health", timeout=30).json()
    out = []
    for r in health.get("replicas", []):
        info = psutil.Process(r["pid"]).memory_full_info()
        out.append({"replica": r["replica"], "pid": r["pid"], "rss_mib": info.rss / 2**20,
                    "uss_mib": info.uss / 2**20})
    return out


def round_trip_ms(url: str, n: int = 30) -> float:
    """Median milliseconds of a POST /tokenize of a few words: the HTTP path's own cost (Ray's proxy, the ingress
    and the hop to a replica, or uvicorn alone)."""
    times = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            c.post("/tokenize", json={"content": "a few words"}).raise_for_status()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def run(args, routing: str | None) -> dict:
    proc, url = start(args, routing)
    try:
        rtt = round_trip_ms(url)
        replicas = {r["pid"] for r in httpx.get(url + "/health", timeout=30).json().get("replicas", [])} or {proc.pid}
        cpu_before = _cpu_seconds(proc, replicas)
        before = totals(url)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(args.clients) as pool:
            convs = list(pool.map(lambda i: conversation(url, i, args.turns, args.n_gen), range(args.conversations)))
        wall = time.perf_counter() - t0
        after = totals(url)
        cpu = [b - a for a, b in zip(cpu_before, _cpu_seconds(proc, replicas), strict=True)]
        mem = memory(url) if routing else [{"replica": "single", **_own_memory(proc)}]
        rest = _rest_uss_mib(proc, {m.get("pid") for m in mem})
    finally:
        stop(proc)
    cached = after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"]
    decoded = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    later = [(turns[t - 1][0], turns[t][0]) for turns in convs for t in range(1, len(turns))]
    latencies = sorted(s for turns in convs for _, s, _ in turns)
    n_gen = sum(n for turns in convs for _, _, n in turns)
    return {"routing": routing or "single process", "cached_share": cached / (cached + decoded),
            "prompt_tokens": int(cached + decoded), "cached_tokens": int(cached),
            "same_replica_share": sum(a == b for a, b in later) / len(later) if later else 1.0,
            "gen_tokens_per_s": n_gen / wall, "requests_per_s": len(latencies) / wall, "wall_s": wall,
            "latency_p50_s": statistics.median(latencies), "latency_p95_s": latencies[int(0.95 * len(latencies))],
            "round_trip_ms": rtt, "memory": mem, "other_processes_uss_mib": rest, "replicas_cpu_s": cpu[0],
            "other_processes_cpu_s": cpu[1]}


def _cpu_seconds(proc: subprocess.Popen, replicas: set) -> tuple[float, float]:
    """CPU seconds (user + system) so far of the replicas, and of the server's other processes."""
    out = [0.0, 0.0]
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid not in replicas] += t.user + t.system
    return out[0], out[1]


def _rest_uss_mib(proc: subprocess.Popen, replicas: set) -> float:
    """USS of the server's other processes (Ray's GCS, raylet, controller, proxy, the ingress, the driver), MiB."""
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    total = 0
    for p in procs:
        if p.pid not in replicas:
            try:
                total += p.memory_full_info().uss
            except psutil.Error:
                pass
    return total / 2**20


def _own_memory(proc: subprocess.Popen) -> dict:
    info = psutil.Process(proc.pid).memory_full_info()
    return {"pid": proc.pid, "rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads per replica")
    ap.add_argument("-np", "--parallel", type=int, default=16, help="slots per replica")
    ap.add_argument("-c", "--ctx-size", type=int, default=16384, help="KV cells per replica")
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8, help="conversations at a time")
    ap.add_argument("-n", "--n-gen", type=int, default=16, help="tokens per answer")
    ap.add_argument("--routing", default="affinity,round-robin")
    ap.add_argument("--single", action="store_true", help="also one process with one replica's flags, no Ray")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    results = [run(args, routing) for routing in args.routing.split(",")]
    if args.single:
        results.append(run(args, None))
    print(f"{args.conversations} conversations x {args.turns} turns, {args.clients} at a time, {args.replicas} "
          f"replicas x (-t {args.threads}, -np {args.parallel}, -c {args.ctx_size}), {args.n_gen} tokens per answer")
    print("| routing | cached share | same replica | gen tok/s | req/s | p50 s | p95 s | /tokenize ms "
          "| CPU s replicas / rest | RSS MiB per replica | USS MiB per replica | USS MiB of the rest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        rss = " / ".join(f"{m['rss_mib']:.0f}" for m in r["memory"])
        uss = " / ".join(f"{m['uss_mib']:.0f}" for m in r["memory"])
        print(f"| {r['routing']} | {r['cached_share']:.1%} | {r['same_replica_share']:.0%} | "
              f"{r['gen_tokens_per_s']:.1f} | {r['requests_per_s']:.2f} | {r['latency_p50_s']:.2f} | "
              f"{r['latency_p95_s']:.2f} | {r['round_trip_ms']:.1f} | {r['replicas_cpu_s']:.0f} / "
              f"{r['other_processes_cpu_s']:.0f} | {rss} | {uss} | "
              f"{r['other_processes_uss_mib']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
