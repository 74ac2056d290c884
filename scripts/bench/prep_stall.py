#!/usr/bin/env python3
"""How much other requests' prompt tokenization stalls a running stream over the HTTP API.

Against a running `specd serve --http-listen`: one client streams a greedy completion and
records when each event arrives, first alone, then while FLOODERS clients post /tokenize
requests of PROMPT_BYTES of text back to back. Prints the gaps between the stream's events
(median, p99, max) in both phases, and how many prompt bytes the flooders had tokenized, as JSON
on the last line. Tokenizing on the server's network threads shows as gaps of a whole prompt's
tokenization; tokenizing on the coordinator's work queue does not.

usage: prep_stall.py HOST:PORT [--flooders 4] [--prompt-bytes 1000000] [--max-tokens 200]
"""
import argparse
import http.client
import json
import statistics
import threading
import time


def stream_gaps(host, port, max_tokens):
    """Event arrival gaps (ms) of one streamed greedy completion."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"stream: HTTP {resp.status}: {resp.read()[:200]!r}")
    times = []
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                break
            times.append(time.perf_counter())
    conn.close()
    return [(b - a) * 1e3 for a, b in zip(times, times[1:])]


def summary(gaps):
    s = sorted(gaps)
    return {"events": len(s) + 1, "median_ms": round(statistics.median(s), 3),
            "p99_ms": round(s[min(len(s) - 1, int(0.99 * len(s)))], 3), "max_ms": round(s[-1], 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--flooders", type=int, default=4)
    ap.add_argument("--prompt-bytes", type=int, default=1_000_000)
    ap.add_argument("--max-tokens", type=int, default=200)
    a = ap.parse_args()
    host, port = a.address.rsplit(":", 1)
    port = int(port)

    alone = stream_gaps(host, port, a.max_tokens)

    words = "the little dog ran to the park and saw a big red ball . "
    prompt = (words * (a.prompt_bytes // len(words) + 1))[:a.prompt_bytes]
    body = json.dumps({"prompt": prompt})
    stop = threading.Event()
    done_bytes = [0] * a.flooders
    errors = []

    def flood(i):
        conn = http.client.HTTPConnection(host, port, timeout=600)
        while not stop.is_set():
            conn.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            payload = r.read()
            if r.status != 200:
                errors.append(f"/tokenize: HTTP {r.status}: {payload[:200]!r}")
                return
            done_bytes[i] += len(prompt)
        conn.close()

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(a.flooders)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # every flooder has a request in flight
    flooded = stream_gaps(host, port, a.max_tokens)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(errors[0])
    out = {"alone": summary(alone), "flooded": summary(flooded),
           "flooders": a.flooders, "prompt_bytes": a.prompt_bytes,
           "tokenized_mb": round(sum(done_bytes) / 1e6, 1)}
    print(f"alone:   {out['alone']}")
    print(f"flooded: {out['flooded']} ({a.flooders} clients, {out['tokenized_mb']} MB tokenized)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
