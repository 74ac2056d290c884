#!/usr/bin/python3
"""Brings up deploy/docker-compose.yml for real and checks the stack from the outside.

The specd image is the runtime-only one, packed from this build by scripts/containers.sh, which
also installs and starts the Docker engine (and stops it again), makes the debian:12 base image
and the Debian-based Prometheus image. On the synthetic default pair (the demo's: a
stories15M-shaped target and its 2-layer early-exit draft), made here:

 1. every service's health check turns healthy, and the coordinator answers health SERVING on
    its published port;
 2. only the coordinator's APIs (gRPC and HTTP) and /metrics and Prometheus are published, only
    on 127.0.0.1, in
    the compose file and in `docker port`; the workers publish nothing and sit only on the
    internal network;
 3. the coordinator reaches both workers over their Unix sockets in the shared volume
    (--local-socket), and Prometheus scrapes all three processes;
 4. a stream from tests/clients/python_client.py through the published port gives the greedy
    tokens `specd serve` gives on the host, and so does an OpenAI completion through the published
    HTTP port;
 5. the target worker's main process (host pid from `docker inspect`), SIGKILLed mid-stream,
    comes back by the restart policy (RestartCount goes up) and the stream completes with the
    same tokens;
 6. the coordinator's counters in Prometheus moved by exactly the Usage the client saw, and no
    request failed;
 7. `docker stop` of the coordinator mid-stream drains: the stream completes, the container exits
    0 within stop_grace_period; stopping the rest takes no kill timeout either (all exit 0);
 8. `docker-compose down -v` leaves no container, network or volume of the project.
Traffic goes only to 127.0.0.1; no container address is ever contacted.

usage: compose_stack_test.py SOURCE_DIR BUILD_DIR
Exit status 77 (skipped) when no container engine can run here, unless SPECD_REQUIRE_CONTAINERS=1
(CI), which makes that a failure.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request

import yaml

DOCKER = "/usr/bin/docker"
IMAGE = "specd:compose-test"
PROJECT = "specd-compose-test"
NO_ENGINE = 77
PROMPT = [1, 500, 501, 502]
SHORT, LONG = 48, 200  # new tokens: the plain request, and the ones something happens during
COUNTERS = {
    "prompt_tokens": "specd_prompt_tokens_total",
    "completion_tokens": "specd_generation_tokens_total",
    "draft_tokens": "specd_spec_decode_num_draft_tokens_total",
    "accepted_tokens": "specd_spec_decode_num_accepted_tokens_total",
    "drafting_rounds": "specd_spec_decode_num_drafts_total",
}

START = time.monotonic()


def log(message):
    print(f"[compose-stack {time.monotonic() - START:5.1f}s] {message}", flush=True)


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(args, timeout=120, env=None, check_status=True):
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    if check_status and result.returncode != 0:
        raise Failure(f"{' '.join(args)} exited {result.returncode}:\n"
                      f"{result.stdout}{result.stderr}")
    return result


def wait_for(what, predicate, timeout, interval=0.5):
    """Polls predicate() until it returns something true; fails naming `what` after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def inspect(container, template):
    return run([DOCKER, "inspect", "-f", template, container]).stdout.strip()


class Stack:
    def __init__(self, source_dir, models_dir):
        deploy = os.path.join(source_dir, "deploy")
        self.compose_file = os.path.join(deploy, "docker-compose.yml")
        self.env = dict(os.environ, SPECD_IMAGE=IMAGE, SPECD_MODELS_DIR=models_dir,
                        SPECD_KV_TOKENS="4096", SPECD_PUBLIC_PORT="", SPECD_HTTP_PORT="",
                        SPECD_COORDINATOR_METRICS_PORT="", PROMETHEUS_PORT="", GRAFANA_PORT="")
        self.base = ["docker-compose", "--env-file", os.path.join(deploy, ".env"),
                     "-f", self.compose_file, "-p", PROJECT]

    def compose(self, *args, timeout=180):
        return run(self.base + list(args), timeout=timeout, env=self.env)

    def containers(self):
        """{service: container id} of the project's containers, running or not."""
        out = run([DOCKER, "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
                   "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}']).stdout
        return {service: cid for cid, service in (line.split() for line in out.splitlines())}

    def config(self):
        return yaml.safe_load(self.compose("config").stdout)

    def down(self):
        result = run(self.base + ["down", "-v", "--remove-orphans", "--timeout", "30"],
                     timeout=180, env=self.env, check_status=False)
        if result.returncode != 0:
            log(f"docker-compose down: {result.stdout}{result.stderr}")

    def leftovers(self):
        label = f"label=com.docker.compose.project={PROJECT}"
        return {kind: run([DOCKER, kind, "ls", "-q", "--filter", label] if kind != "container"
                          else [DOCKER, "ps", "-aq", "--filter", label]).stdout.split()
                for kind in ("container", "network", "volume")}

    def describe(self):
        """What a person debugging a failure wants: each service's state and its last logs."""
        for service, cid in self.containers().items():
            state = run([DOCKER, "inspect", "-f", "{{json .State}}", cid], check_status=False)
            print(f"--- {service}: {state.stdout.strip()}")
        logs = run(self.base + ["logs", "--no-color", "--tail", "30"], env=self.env,
                   check_status=False)
        print(logs.stdout[-6000:], logs.stderr[-2000:])


class Prometheus:
    def __init__(self, port):
        self.url = f"http://127.0.0.1:{port}/api/v1/query?"
        # Straight to loopback, whatever proxy the environment names.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def query(self, expr):
        with self.opener.open(self.url + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
            body = json.load(r)
        check(body.get("status") == "success", f"Prometheus query {expr}: {body}")
        return body["data"]["result"]

    def scalar(self, expr):
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0

    def counters(self, after):
        """The coordinator's counters, from a scrape that happened after `after` (epoch s)."""
        coordinator = '{job="specd-coordinator"}'
        wait_for(f"a Prometheus scrape of the coordinator after t={after:.0f}",
                 lambda: self.scalar(f"timestamp(specd_generation_tokens_total{coordinator})")
                 > after, timeout=60)
        values = {field: self.scalar(name + coordinator) for field, name in COUNTERS.items()}
        values["succeeded"] = self.scalar(f"sum(specd_request_success_total{coordinator})")
        values["failed"] = self.scalar(f"sum(specd_request_errors_total{coordinator})")
        for series in self.query("specd_spec_decode_num_accepted_tokens_per_pos_total"
                                 + coordinator):
            values[f"position {series['metric']['position']}"] = float(series["value"][1])
        return values


def make_models(specd, models_dir):
    target, draft = os.path.join(models_dir, "target"), os.path.join(models_dir, "draft")
    run([specd, "synth", "--shape", "stories15M", "--residual-scale", "0.1", "--seed", "1",
         "--out", target])
    run([specd, "synth", "--early-exit-of", target, "--layers", "2", "--out", draft])
    # The containers run as uid 10001: every file readable, every folder searchable.
    for root, dirs, files in os.walk(models_dir):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return target, draft


def expected_on_host(specd, target, draft, client):
    """The reference: the same requests to `specd serve` on the host."""
    serve = subprocess.Popen(
        [specd, "serve", "--target", target, "--draft", draft, "--listen", "127.0.0.1:0",
         "--kv-tokens", "4096"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("listening on ") and time.monotonic() < deadline:
            line = serve.stdout.readline()
            check(line or serve.poll() is None, "specd serve on the host exited before listening")
        check(line.startswith("listening on "), "specd serve on the host did not start in 120 s")
        address = line.split()[-1]
        return {n: client.generate(address, PROMPT, n) for n in (SHORT, LONG)}
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


def published(container):
    """`docker port`: {"50051/tcp": ["127.0.0.1:49153"], ...}"""
    out = {}
    for line in run([DOCKER, "port", container]).stdout.splitlines():
        inside, _, host = line.partition(" -> ")
        out.setdefault(inside.strip(), []).append(host.strip())
    return out


def host_port(container, inside):
    hosts = published(container).get(inside, [])
    check(len(hosts) == 1, f"{inside} of {container} is published as {hosts}")
    return int(hosts[0].rpartition(":")[2])


def same_stream(got, want, what):
    check(got["finish_reason"] == "FINISH_REASON_LENGTH",
          f"{what}: finished with {got['finish_reason']!r}")
    check(got["token_ids"] == want["token_ids"],
          f"{what}: tokens differ from specd serve on the host:\n{got['token_ids']}\n"
          f"{want['token_ids']}")
    check(got["text"] == want["text"], f"{what}: text differs from specd serve on the host")


def http_completion(port, want):
    """A greedy OpenAI completion of PROMPT through the published HTTP port: the same text as the
    gRPC stream of specd serve on the host."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = f"http://127.0.0.1:{port}"
    with opener.open(f"{base}/v1/models", timeout=30) as r:
        model = json.load(r)["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": SHORT, "temperature": 0,
                       "ignore_eos": True, "num_speculative_tokens": 3}).encode()
    request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=60) as r:
        got = json.load(r)
    choice = got["choices"][0]
    check(choice["finish_reason"] == "length", f"HTTP completion finished with {choice}")
    check(got["usage"]["completion_tokens"] == SHORT, f"HTTP completion usage {got['usage']}")
    check(choice["text"] == want["text"],
          f"HTTP completion text differs from specd serve on the host:\n{choice['text']!r}\n"
          f"{want['text']!r}")
    log(f"an OpenAI completion through the published HTTP port {port} ({model}): the same text")


def check_publishing(stack, containers):
    config = stack.config()
    services = config["services"]
    publishing = {name for name, s in services.items() if s.get("ports")}
    check(publishing == {"coordinator", "prometheus", "grafana"},
          f"services that publish ports in the compose file: {sorted(publishing)}")
    check(services["grafana"].get("profiles") == ["grafana"], "grafana must be behind a profile")
    for name in publishing:
        for port in services[name]["ports"]:
            spec = port if isinstance(port, str) else f"{port.get('host_ip')}:"
            check(spec.startswith("127.0.0.1:"), f"{name} publishes {port}, not on 127.0.0.1")
    for name in ("target-worker", "draft-worker"):
        check(list(services[name]["networks"]) == ["internal"],
              f"{name} networks: {services[name]['networks']}")
    check(config["networks"]["internal"].get("internal") is True,
          "the compose file's internal network must be internal")

    ports = {name: published(cid) for name, cid in containers.items()}
    check(set(ports["coordinator"]) == {"50051/tcp", "8000/tcp", "9400/tcp"},
          f"coordinator publishes {ports['coordinator']}")
    check(set(ports["prometheus"]) == {"9090/tcp"}, f"prometheus publishes {ports['prometheus']}")
    for name in ("target-worker", "draft-worker"):
        check(ports[name] == {}, f"{name} publishes {ports[name]}")
    for name, mapping in ports.items():
        for hosts in mapping.values():
            check(all(h.startswith("127.0.0.1:") for h in hosts), f"{name} publishes on {hosts}")

    internal = f"{PROJECT}_internal"
    check(inspect(internal, "{{.Internal}}") == "true", f"network {internal} is not internal")
    for name in ("target-worker", "draft-worker"):
        networks = json.loads(inspect(containers[name], "{{json .NetworkSettings.Networks}}"))
        check(set(networks) == {internal}, f"{name} is on {sorted(networks)}")
    log("published: coordinator 50051, 8000 and 9400, prometheus 9090, all on 127.0.0.1; "
        "workers none, on the internal network only")


def check_users_and_tools(containers):
    for name, cid in containers.items():
        uid = run([DOCKER, "exec", cid, "id", "-u"]).stdout.strip()
        check(uid not in ("", "0"), f"{name} runs as uid {uid!r}")
    check(inspect(IMAGE, "{{.Config.User}}") == "10001:10001",
          f"{IMAGE} runs as {inspect(IMAGE, '{{.Config.User}}')!r}")
    # apt-get, which every Debian image has, shows that the probe itself works.
    tools = run([DOCKER, "run", "--rm", "--entrypoint", "sh", IMAGE, "-c",
                 "for t in cc gcc g++ c++ cmake make ld as apt-get; do command -v $t; done"],
                check_status=False).stdout.split()
    check(tools == ["/usr/bin/apt-get"], f"{IMAGE} holds build tools: {tools}")
    log("every service runs as a non-root user; the specd image holds no build tools")


def kill_target_mid_stream(stack, containers, client, address, expected):
    target = containers["target-worker"]
    pid = int(inspect(target, "{{.State.Pid}}"))
    restarts = int(inspect(target, "{{.RestartCount}}"))
    check(pid > 0, "the target worker is not running")
    killed = {}

    def on_message(msg):
        if not killed:
            killed["mid_stream"] = not msg.finish_reason
            os.kill(pid, signal.SIGKILL)
            log(f"SIGKILLed the target worker (host pid {pid}) after the first message")

    got = client.generate(address, PROMPT, LONG, on_message=on_message, timeout=120)
    check(killed.get("mid_stream"), "the stream ended before the kill; make it longer")
    same_stream(got, expected, "the stream during which the target worker was killed")
    wait_for("the target worker's RestartCount to go up",
             lambda: int(inspect(target, "{{.RestartCount}}")) > restarts, timeout=60)
    wait_for("the restarted target worker to turn healthy",
             lambda: inspect(target, "{{.State.Health.Status}}") == "healthy", timeout=120)
    check(int(inspect(target, "{{.State.Pid}}")) != pid, "the target worker kept its pid")
    log(f"target worker restarted by Docker (RestartCount {restarts} -> "
        f"{inspect(target, '{{.RestartCount}}')}); the stream completed with the same tokens")
    return got


def stop_coordinator_mid_stream(stack, containers, client, address, expected, grace):
    coordinator = containers["coordinator"]
    stop_timeout = inspect(coordinator, "{{.Config.StopTimeout}}")
    check(stop_timeout == str(grace),
          f"the coordinator's StopTimeout is {stop_timeout}, not stop_grace_period {grace}")
    stopped = {}

    def stop():
        began = time.monotonic()
        stopped["result"] = run([DOCKER, "stop", coordinator], timeout=grace + 30,
                                check_status=False)
        stopped["seconds"] = time.monotonic() - began

    stopper = threading.Thread(target=stop)

    def on_message(msg):
        if not stopper.is_alive() and "began" not in stopped:
            stopped["began"] = True
            stopped["mid_stream"] = not msg.finish_reason
            stopper.start()

    got = client.generate(address, PROMPT, LONG, on_message=on_message, timeout=120)
    stopper.join(timeout=grace + 40)
    check(stopped.get("mid_stream"), "the stream ended before docker stop; make it longer")
    check("seconds" in stopped, "docker stop did not return")
    check(stopped["result"].returncode == 0, f"docker stop: {stopped['result'].stderr}")
    same_stream(got, expected, "the stream during which the coordinator was stopped")
    exit_code = inspect(coordinator, "{{.State.ExitCode}}")
    check(exit_code == "0", f"the coordinator exited {exit_code} (137: SIGKILLed at the timeout)")
    check(stopped["seconds"] < grace,
          f"docker stop took {stopped['seconds']:.1f} s, not within stop_grace_period {grace} s")
    logs = run([DOCKER, "logs", coordinator]).stderr
    check("SIGTERM: draining" in logs, "the coordinator's log does not show a SIGTERM drain")
    log(f"docker stop drained the coordinator in {stopped['seconds']:.1f} s (grace {grace} s), "
        "exit 0, the stream completed")


def scenario(source_dir, build_dir, workdir, stack):
    sys.path.insert(0, os.path.join(source_dir, "tests", "clients"))
    import python_client as client  # noqa: E402

    client.generate_stubs(source_dir, os.path.join(workdir, "stubs"))
    specd = os.path.join(build_dir, "tools", "specd")
    target, draft = make_models(specd, os.path.join(workdir, "models"))
    log("made the synthetic default pair")
    expected = expected_on_host(specd, target, draft, client)
    log(f"reference streams from specd serve on the host: {SHORT} and {LONG} tokens")

    stack.compose("up", "-d", "--no-build")
    log("docker-compose up -d returned")
    containers = stack.containers()
    check(set(containers) == {"coordinator", "target-worker", "draft-worker", "prometheus"},
          f"docker-compose up made containers for {sorted(containers)}")

    def all_healthy():
        states = {s: inspect(c, "{{.State.Health.Status}}") for s, c in containers.items()}
        for s, c in containers.items():
            check(inspect(c, "{{.State.Status}}") in ("running", "restarting"),
                  f"{s} is {inspect(c, '{{.State.Status}}')}")
        return all(v == "healthy" for v in states.values())

    wait_for("every service's health check to pass", all_healthy, timeout=180)
    api = f"127.0.0.1:{host_port(containers['coordinator'], '50051/tcp')}"
    health = run([specd, "health", "--server", api], check_status=False)
    check(health.returncode == 0, f"specd health --server {api}: {health.stdout}{health.stderr}")
    log(f"all healthy; the coordinator answers SERVING on {api}")

    check_publishing(stack, containers)
    check_users_and_tools(containers)
    serving = [line for line in run([DOCKER, "logs", containers["coordinator"]]).stderr.splitlines()
               if "serving on" in line]
    for sock in ("/run/specd/target-worker.sock", "/run/specd/draft-worker.sock"):
        check(any(f"via {sock}" in line for line in serving),
              f"the coordinator does not reach a worker over {sock}: {serving}")
    log("the coordinator makes its round calls over both workers' sockets in the shared volume")

    prometheus = Prometheus(host_port(containers["prometheus"], "9090/tcp"))
    instances = {"coordinator:9400", "draft-worker:9400", "target-worker:9400"}
    wait_for("Prometheus to scrape all three specd processes",
             lambda: {r["metric"]["instance"] for r in prometheus.query("up == 1")} >= instances,
             timeout=60)
    log("Prometheus scrapes the coordinator and both workers")
    http_completion(host_port(containers["coordinator"], "8000/tcp"), expected[SHORT])
    before = prometheus.counters(after=time.time())

    plain = client.generate(api, PROMPT, SHORT)
    same_stream(plain, expected[SHORT], "the stream through the published port")
    log(f"{SHORT} tokens through the published port, the same as specd serve on the host")
    during_kill = kill_target_mid_stream(stack, containers, client, api, expected[LONG])

    after = prometheus.counters(after=time.time())
    usages = [plain["usage"], during_kill["usage"]]
    want = {field: sum(u[field] for u in usages) for field in COUNTERS}
    want["succeeded"], want["failed"] = 2, 0
    for u in usages:
        for k, n in enumerate(u["accepted_per_position"]):
            want[f"position {k}"] = want.get(f"position {k}", 0) + n
    deltas = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in want}
    check(deltas == {k: float(v) for k, v in want.items()},
          f"Prometheus counter deltas {deltas} differ from the clients' Usage {want}")
    log(f"Prometheus counter deltas equal the clients' Usage: {want}")

    period = stack.config()["services"]["coordinator"]["stop_grace_period"]
    check(period.endswith("s") and period[:-1].isdigit(), f"stop_grace_period {period!r}")
    grace = int(period[:-1])
    stop_coordinator_mid_stream(stack, containers, client, api, expected[LONG], grace)

    began = time.monotonic()
    stack.compose("stop")
    took = time.monotonic() - began
    for name, cid in containers.items():
        code = inspect(cid, "{{.State.ExitCode}}")
        check(code == "0", f"{name} exited {code} on docker-compose stop (137: SIGKILLed)")
    check(took < grace, f"docker-compose stop took {took:.1f} s")
    log(f"docker-compose stop: every service exited 0 on SIGTERM, in {took:.1f} s")

    stack.compose("down", "-v")
    left = stack.leftovers()
    check(not any(left.values()), f"left after docker-compose down -v: {left}")
    log("docker-compose down -v left no container, network or volume")


def inside(source_dir, build_dir):
    check(run([DOCKER, "image", "inspect", IMAGE], check_status=False).returncode == 0,
          f"{IMAGE} was not built")
    workdir = tempfile.mkdtemp(prefix="specd-compose-test-", dir="/var/tmp")
    os.chmod(workdir, 0o755)
    stack = Stack(source_dir, os.path.join(workdir, "models"))
    os.makedirs(os.path.join(workdir, "models"))
    stack.down()  # what a killed earlier run may have left
    try:
        scenario(source_dir, build_dir, workdir, stack)
        print("compose stack test: passed")
        return 0
    except Exception as e:  # noqa: BLE001 - any failure: say what, show the stack, clean up
        if not isinstance(e, Failure):
            traceback.print_exc()
        print(f"FAILED: {e}")
        try:
            stack.describe()
        except Exception as described:  # noqa: BLE001 - the failure above is the news
            print(f"(could not describe the stack: {described})")
        return 1
    finally:
        stack.down()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    source_dir, build_dir = (os.path.abspath(a) for a in sys.argv[1:3])
    if os.environ.get("SPECD_COMPOSE_STACK_INSIDE") == "1":
        return inside(source_dir, build_dir)
    status = subprocess.run(
        ["bash", os.path.join(source_dir, "scripts", "containers.sh"), "--runtime-only",
         build_dir, "--tag", IMAGE, "--", sys.executable, os.path.abspath(__file__), source_dir,
         build_dir],
        env=dict(os.environ, SPECD_COMPOSE_STACK_INSIDE="1")).returncode
    if status == NO_ENGINE:
        if os.environ.get("SPECD_REQUIRE_CONTAINERS") == "1":
            print("SPECD_REQUIRE_CONTAINERS=1, and no container engine can run here (see above)")
            return 1
        print("skipped: no container engine can run here (see above)")
    return status


if __name__ == "__main__":
    sys.exit(main())
