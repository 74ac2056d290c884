"""A server process for the benchmark scripts: started, waited for, and stopped."""
import subprocess
import sys
import time


class Server:
    """A server process on a loopback port, stopped on close().

    `ready`: text its output prints once it serves; `port_of(output)` then reads where (kept as
    .port). A server that exits first, or is not ready within 300 s, ends the script, naming it.
    """

    def __init__(self, name, cmd, ready, port_of, log_path):
        self.log = open(log_path, "w+b")
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited:\n{self.output()[-3000:]}")
            out = self.output()
            if ready in out:
                self.port = port_of(out)
                return
            time.sleep(0.2)
        self.close()
        sys.exit(f"{name} did not become ready in 300 s")

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
