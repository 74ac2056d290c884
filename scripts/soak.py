#!/usr/bin/python3
"""Soak test: mixed load against `specd serve` with cancellations and worker restarts.

Starts `specd serve` on a synthetic pair, runs client threads that send a mix of greedy and seeded
sampled requests (various K, lengths and stop strings), cancels some of them mid-stream, and
SIGKILLs one worker (target and draft in turn) every --restart-every seconds; `specd serve` must
restart it and the coordinator must replay its sequences. At the end it reports:

  - requests served, and errors by gRPC status code (a client's own cancellation is not an error);
  - replays that disagreed: every request is deterministic (greedy, or sampled with a fixed seed),
    so a request sent again must stream exactly the same tokens, restarts or not;
  - the RSS of each process after warm-up and at the end (a restarted worker is compared with its
    own first reading after the restart);
  - KV blocks in use on each worker at the end (read from the workers' Info), which must be 0.

It exits non-zero when any check fails: an error other than the client's cancellations, a replay
mismatch, RSS growth over --max-rss-growth, or KV blocks still in use.

usage: soak.py --specd BUILD/tools/specd [--duration 1800] [--restart-every 300] [--shape tiny]
               [--streams 8] [--json FILE]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = [
    "Once upon a time",
    "The little dog ran to the park and",
    "She looked at the sky and said",
    "Tom had a red ball. One day",
    "In a small house by the sea, there lived",
    "The cat and the bird were friends.",
    "Lily wanted to bake a cake for her mom",
    "It was a sunny day, and the children",
]


def log(msg):
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def generate_stubs(source_dir, stub_dir):
    proto_root = os.path.join(source_dir, "proto")
    for proto in ("specd/v1/generation.proto", "specd/worker/v1/worker.proto"):
        subprocess.run(
            ["protoc", f"--proto_path={proto_root}", f"--python_out={stub_dir}",
             f"--grpc_out={stub_dir}", "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
             os.path.join(proto_root, proto)],
            check=True)
    sys.path.insert(0, stub_dir)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    """{'coordinator'|'draft'|'target': pid} among the direct children of `pid`."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid != pid:
            continue
        for role, prefix in (("coordinator", "specd-coordinat"), ("draft", "specd-draft-wor"),
                             ("target", "specd-target-wo")):
            if comm.startswith(prefix):
                found[role] = int(entry)
    return found


class Server:
    """`specd serve` in the background; its output is kept for the worker addresses."""

    def __init__(self, specd, target, draft, threads, work_dir):
        self.log_path = os.path.join(work_dir, "serve.log")
        self.log_file = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [specd, "serve", "--target", target, "--draft", draft, "--listen", "127.0.0.1:0",
             "--threads", str(threads), "--kv-tokens", "8192"],
            stdout=subprocess.PIPE, stderr=self.log_file, text=True)
        self.address = None
        deadline = time.time() + 300
        for line in self.proc.stdout:
            m = re.search(r"listening on (\S+)", line)
            if m:
                self.address = m.group(1)
                break
            if time.time() > deadline:
                break
        if self.address is None:
            raise RuntimeError(f"specd serve did not start; see {self.log_path}")
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    def _drain_stdout(self):
        for _ in self.proc.stdout:
            pass

    def worker_addresses(self):
        """The latest address each worker announced (a restarted worker keeps its port)."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        out = {}
        for role, service in (("target", "TargetWorker"), ("draft", "DraftWorker")):
            hits = re.findall(rf"serving specd\.worker\.v1\.{service} on (\S+)", text)
            if hits:
                out[role] = hits[-1]
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()


class Load:
    """Client threads sending deterministic requests; each request kind is sent many times."""

    def __init__(self, address, streams, seed):
        import grpc  # noqa: E402
        from specd.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
        self.grpc = grpc
        self.pb = generation_pb2
        self.channel = grpc.insecure_channel(address)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.streams = streams
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.served = 0
        self.cancelled = 0
        self.errors = {}
        self.error_samples = {}
        self.first_output = {}  # request kind -> tokens of its first complete run
        self.mismatches = []
        self.threads = []

    def request_kind(self, rng):
        return (rng.randrange(len(PROMPTS)), rng.choice([0, 0.8, 1.0]), rng.choice([0, 2, 4, 6]),
                rng.choice([8, 24, 64, 128]), rng.randrange(4), rng.random() < 0.15)

    def make_request(self, kind):
        prompt, temperature, k, max_new, seed, with_stop = kind
        stopping = self.pb.StoppingCriteria(max_new_tokens=max_new, ignore_eos=True)
        if with_stop:
            stopping.stop.append("e.")
        return self.pb.GenerateRequest(
            text=PROMPTS[prompt],
            sampling=self.pb.SamplingParameters(temperature=temperature, seed=1000 + seed),
            stopping=stopping,
            speculation=self.pb.SpeculationParameters(num_speculative_tokens=k))

    def worker(self, index):
        rng = random.Random(self.rng.random() + index)
        while not self.stop_event.is_set():
            kind = self.request_kind(rng)
            cancel_after = rng.choice([None] * 9 + [rng.randint(1, 6)])
            call = self.stub.Generate(self.make_request(kind), timeout=600)
            tokens = []
            try:
                messages = 0
                for msg in call:
                    tokens.extend(msg.token_ids)
                    messages += 1
                    if cancel_after is not None and messages >= cancel_after:
                        call.cancel()
                        break
            except self.grpc.RpcError as e:
                code = e.code()
                if code == self.grpc.StatusCode.CANCELLED and cancel_after is not None:
                    with self.lock:
                        self.cancelled += 1
                    continue
                with self.lock:
                    self.errors[code.name] = self.errors.get(code.name, 0) + 1
                    self.error_samples.setdefault(code.name, e.details())
                continue
            if cancel_after is not None and call.code() == self.grpc.StatusCode.CANCELLED:
                with self.lock:
                    self.cancelled += 1
                continue
            with self.lock:
                self.served += 1
                first = self.first_output.setdefault(kind, tokens)
                if first != tokens:
                    self.mismatches.append({"kind": list(kind), "first": first, "now": tokens})

    def start(self):
        for i in range(self.streams):
            t = threading.Thread(target=self.worker, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=900)


def kv_in_use(address, role):
    import grpc  # noqa: E402
    from specd.worker.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
    options = [("grpc.max_receive_message_length", 256 << 20)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = (worker_pb2_grpc.TargetWorkerStub(channel) if role == "target"
                else worker_pb2_grpc.DraftWorkerStub(channel))
        info = stub.Info(worker_pb2.InfoRequest(), timeout=10)
        return info.kv_total_blocks - info.kv_free_blocks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--specd", required=True, help="path of the built `specd` binary")
    parser.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--duration", type=float, default=1800, help="seconds of load")
    parser.add_argument("--restart-every", type=float, default=300,
                        help="seconds between worker SIGKILLs (0 = never)")
    parser.add_argument("--warmup", type=float, default=20,
                        help="seconds of load before the first RSS reading")
    parser.add_argument("--shape", default="tiny", help="`specd synth` shape of the target")
    parser.add_argument("--exit-layer", type=int, default=1, help="layers of the early-exit draft")
    parser.add_argument("--streams", type=int, default=8, help="concurrent client streams")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--max-rss-growth", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="specd-soak-")
    generate_stubs(args.source_dir, work)
    target = os.path.join(work, "target")
    draft = os.path.join(work, "draft")
    log(f"synthesizing a {args.shape} pair in {work}")
    subprocess.run([args.specd, "synth", "--shape", args.shape, "--residual-scale", "0.05",
                    "--out", target], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([args.specd, "synth", "--early-exit-of", target, "--layers",
                    str(args.exit_layer), "--out", draft], check=True, stdout=subprocess.DEVNULL)
    server = Server(args.specd, target, draft, args.threads, work)
    log(f"serving on {server.address}")
    load = Load(server.address, args.streams, args.seed)
    start = time.time()
    load.start()
    time.sleep(min(args.warmup, args.duration))
    rss_start = {}
    for role, pid in children(server.proc.pid).items():
        rss_start[role] = {"pid": pid, "kib": rss_kib(pid)}
    log(f"RSS after warm-up (KiB): { {r: v['kib'] for r, v in rss_start.items()} }")

    restarts = []
    next_restart = start + args.restart_every if args.restart_every > 0 else float("inf")
    victims = ["target", "draft"]
    restarted_at = {}  # role -> when its new pid was first seen
    last_report = time.time()
    while time.time() - start < args.duration:
        time.sleep(0.5)
        now = time.time()
        if now >= next_restart:
            role = victims[len(restarts) % 2]
            pid = children(server.proc.pid).get(role)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                restarts.append({"at_s": round(now - start, 1), "role": role, "pid": pid})
                log(f"SIGKILL {role} worker (pid {pid})")
            next_restart = now + args.restart_every
        # A worker that came back is measured against its own reading after a warm-up.
        for role, pid in children(server.proc.pid).items():
            if role in rss_start and rss_start[role]["pid"] != pid:
                noticed = restarted_at.setdefault(role, now)
                if now - noticed >= args.warmup:
                    rss_start[role] = {"pid": pid, "kib": rss_kib(pid), "after_restart": True}
                    del restarted_at[role]
        if now - last_report >= 30:
            with load.lock:
                log(f"{now - start:.0f}/{args.duration:.0f} s: served {load.served}, "
                    f"cancelled {load.cancelled}, errors {load.errors}")
            last_report = now
    load.stop()
    time.sleep(1)
    rss_end = {role: {"pid": pid, "kib": rss_kib(pid)}
               for role, pid in children(server.proc.pid).items()}
    kv = {}
    for role, address in server.worker_addresses().items():
        try:
            kv[role] = kv_in_use(address, role)
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            kv[role] = f"unreadable: {e}"
    server.stop()

    growth = {}
    for role, end in rss_end.items():
        begin = rss_start.get(role)
        # A worker restarted less than a warm-up ago has no baseline of its own yet.
        if begin and begin["pid"] == end["pid"] and begin.get("kib") and end.get("kib"):
            growth[role] = end["kib"] / begin["kib"] - 1
    report = {
        "duration_s": round(time.time() - start, 1),
        "shape": args.shape,
        "streams": args.streams,
        "requests_served": load.served,
        "requests_cancelled_by_client": load.cancelled,
        "errors_by_code": load.errors,
        "error_samples": load.error_samples,
        "replay_mismatches": len(load.mismatches),
        "distinct_requests": len(load.first_output),
        "worker_restarts": restarts,
        "rss_kib_start": rss_start,
        "rss_kib_end": rss_end,
        "rss_growth": {r: round(g, 4) for r, g in growth.items()},
        "kv_blocks_in_use_at_end": kv,
    }
    failures = []
    if load.errors:
        failures.append(f"errors: {load.errors} (e.g. {load.error_samples})")
    if load.mismatches:
        failures.append(f"{len(load.mismatches)} repeated requests streamed different tokens")
    for role, g in growth.items():
        if g > args.max_rss_growth:
            failures.append(f"{role} RSS grew {g:.1%} (> {args.max_rss_growth:.0%})")
    for role in ("target", "draft"):
        if kv.get(role) != 0:
            failures.append(f"{role} worker KV blocks in use at the end: {kv.get(role)}")
    if load.served == 0:
        failures.append("no request was served")
    if args.restart_every > 0 and args.restart_every < args.duration and not restarts:
        failures.append("no worker was restarted")
    report["failures"] = failures
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if failures:
        log("FAILED: " + "; ".join(failures))
        return 1
    log("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
