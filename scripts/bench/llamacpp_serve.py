#!/usr/bin/env python3
"""`specd serve` against llama.cpp's `llama-server`: the OpenAI API, same weights, same client.

What a user of either server sees: streamed /v1/completions under 1 to 16 concurrent streams, K = 0
and speculative with the target's first --draft-layers layers as the draft. Both servers run the
checkpoint that scripts/bench/llamacpp.py writes and converts (that script's greedy-parity check
shows the GGUF is the same model), on the same threads (specd: --threads per worker; llama-server:
-t and -tb), and this one client drives both: a thread per stream, each sending its requests one
after another (closed loop), every request a distinct 32-token prompt given as token ids, greedy,
--tokens new tokens with EOS ignored. Arms alternate between the servers, --repeats times; each
figure is the median over the repeats.

  tokens/s  output tokens of the arm / its wall time;
  TTFT      p50 of the time to the first streamed token;
  TPOT      p50 over requests of (last token - first token) / (tokens - 1).

llama-server runs with one slot per stream (-np; restarted for each --streams) and speculates per
request ("speculative.n_max": K, with n_min and p_min 0 so that every round drafts K); specd gets
K as num_speculative_tokens with k_policy "fixed".

usage: /usr/bin/python3 scripts/bench/llamacpp_serve.py --llama-cpp DIR [--dtype bf16]
       [--streams 1,4,16] [--ks 0,4] [--repeats 3] [--threads 2] [--json OUT]
(llama.cpp built as scripts/bench/llamacpp.py says, with the llama-server target too)
"""
import http.client
import json
import pathlib
import random
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llamacpp  # noqa: E402  (the sibling script: models and their GGUF files)
from server import Server  # noqa: E402

PROMPT_TOKENS = 32


def log(msg):
    print(f"llamacpp_serve: {msg}", file=sys.stderr, flush=True)


def start_specd(bench, target, args):
    cmd = [bench.specd_bin, "serve", "--target", target, "--draft-exit-layer", args.draft_layers,
           "--threads", args.threads, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
           "--served-model-name", "bench"]
    return Server("llamacpp_serve: specd", cmd, "listening on ",
                  lambda out: int(out.split("http on ")[1].split()[0].rsplit(":", 1)[1]),
                  bench.work / "specd-serve.log")


def start_llama(bench, target_gguf, draft_gguf, args, slots):
    server = pathlib.Path(args.llama_cpp) / "build/bin/llama-server"
    if not server.exists():
        sys.exit(f"llamacpp_serve: {server} is missing: build llama.cpp's llama-server target")
    port = free_port()
    ctx = slots * (PROMPT_TOKENS + args.tokens + 64)
    # The draft computes on the same threads (llama-server has no thread flag of its own for it).
    cmd = [server, "-m", target_gguf, "-md", draft_gguf, "-t", args.threads, "-tb", args.threads,
           "-np", slots, "-c", ctx, "--host", "127.0.0.1", "--port", port,
           "--draft-max", max(args_ks(args)), "--draft-min", "0", "--draft-p-min", "0"]
    return Server("llamacpp_serve: llama-server", cmd, "server is listening", lambda _: port,
                  bench.work / "llama-server.log")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def args_ks(args):
    return [int(k) for k in args.ks.split(",")]


def body(server, prompt, k, tokens):
    b = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
         "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if server == "specd":
        b.update({"num_speculative_tokens": k, "k_policy": "fixed"})
    else:
        b.update({"speculative.n_max": k, "speculative.n_min": 0, "speculative.p_min": 0.0,
                  "cache_prompt": True})
    return b


def stream_one(port, request):
    """(seconds to first token, seconds to last, completion tokens) of one streamed completion."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(request),
                 {"Content-Type": "application/json"})
    reply = conn.getresponse()
    if reply.status != 200:
        sys.exit(f"llamacpp_serve: HTTP {reply.status}: {reply.read()[:500]!r}")
    first = last = None
    usage = None
    finish = None
    while True:
        line = reply.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            if choice.get("text"):
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
            finish = choice.get("finish_reason") or finish
    conn.close()
    if first is None:
        sys.exit("llamacpp_serve: a completion streamed no text")
    if usage is not None:
        n = usage["completion_tokens"]
    elif finish == "length":
        n = request["max_tokens"]  # ignore_eos: a length finish made exactly max_tokens
    else:
        sys.exit(f"llamacpp_serve: no usage and finish_reason {finish!r}")
    return first - t0, last - t0, n


def run_arm(server, port, prompts, k, streams, tokens):
    results = []
    lock = threading.Lock()
    per_stream = len(prompts) // streams

    def worker(s):
        for prompt in prompts[s * per_stream:(s + 1) * per_stream]:
            r = stream_one(port, body(server, prompt, k, tokens))
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if len(results) != streams * per_stream:
        sys.exit("llamacpp_serve: a stream failed")
    total = sum(n for _, _, n in results)
    return {"tok_s": total / wall,
            "ttft_ms": 1e3 * statistics.median(f for f, _, _ in results),
            "tpot_ms": 1e3 * statistics.median((l - f) / max(n - 1, 1) for f, l, n in results)}


def main():
    p = llamacpp.arg_parser(__doc__)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--streams", default="1,4,16")
    p.add_argument("--ks", default="0,4")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    bench = llamacpp.Bench(args)
    target, target_gguf, draft_gguf = bench.models(args.dtype)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    streams = [int(s) for s in args.streams.split(",")]
    ks = args_ks(args)
    rng = random.Random(1)

    def prompts_for(s):
        n = s * max(2, 4 // s)
        return [[1] + [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS - 1)]
                for _ in range(n)]

    report = {"shape": args.shape, "dtype": args.dtype, "tokens": args.tokens, "arms": []}
    servers = {"specd": start_specd(bench, target, args)}
    try:
        for s in streams:
            # As many slots as streams, as one would configure it: llama.cpp's KV cache is one
            # buffer for every slot, and attention spans the cells in use by any of them.
            servers["llama.cpp"] = start_llama(bench, target_gguf, draft_gguf, args, s)
            for name, server in servers.items():  # warm-up: every K once
                for k in ks:
                    run_arm(name, server.port, prompts_for(1), k, 1, 8)
            for k in ks:
                arm = {"k": k, "streams": s, "specd": [], "llama.cpp": []}
                for r in range(args.repeats):
                    log(f"K = {k}, {s} streams, repeat {r + 1}/{args.repeats}")
                    prompts = prompts_for(s)
                    for name, server in servers.items():
                        arm[name].append(run_arm(name, server.port, prompts, k, s, args.tokens))
                report["arms"].append(arm)
            servers.pop("llama.cpp").close()
    finally:
        for server in servers.values():
            server.close()

    print(f"specd serve against llama-server: {args.shape}-shaped {args.dtype} model, "
          f"{args.tokens} tokens per request, {args.threads} threads, median of {args.repeats}")
    print(f"{'K':>2} {'streams':>7} | {'tok/s specd':>11} {'llama.cpp':>9} {'ratio':>6} | "
          f"{'TTFT ms specd':>13} {'llama.cpp':>9} | {'TPOT ms specd':>13} {'llama.cpp':>9}")
    for arm in report["arms"]:
        med = {n: {m: statistics.median(x[m] for x in arm[n]) for m in ("tok_s", "ttft_ms",
                                                                       "tpot_ms")}
               for n in ("specd", "llama.cpp")}
        arm["median"] = med
        ours, theirs = med["specd"], med["llama.cpp"]
        print(f"{arm['k']:>2} {arm['streams']:>7} | {ours['tok_s']:11.1f} {theirs['tok_s']:9.1f} "
              f"{ours['tok_s'] / theirs['tok_s']:6.2f} | {ours['ttft_ms']:13.1f} "
              f"{theirs['ttft_ms']:9.1f} | {ours['tpot_ms']:13.2f} {theirs['tpot_ms']:9.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
