#!/usr/bin/python3
"""Checks deploy/docker-compose.yml against the built binaries.

1. `docker-compose config` (Debian's docker-compose) accepts the file with deploy/.env, and
   promtool (Debian's prometheus) accepts deploy/prometheus/prometheus.yml.
2. Every specd service's command, and every health check, run with --help against the built
   binaries exits 0, and each --flag it passes is one the binary's --help lists, so compose never
   hands a binary a flag it rejects.

usage: compose_test.py SOURCE_DIR BIN=PATH...   (e.g. specd-coordinator=/build/.../specd-coordinator)
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

SOURCE_DIR = ""
BINARIES = {}


def read_env(path):
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key] = value
    return env


def interpolate(value, env):
    """${NAME} from .env, as compose does; a name missing from .env is an error."""
    if isinstance(value, str):
        def sub(m):
            if m.group(1) not in env:
                raise KeyError(f"docker-compose.yml uses ${{{m.group(1)}}}, which .env does not set")
            return env[m.group(1)]
        return re.sub(r"\$\{([A-Za-z0-9_]+)\}", sub, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


class ComposeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        deploy = os.path.join(SOURCE_DIR, "deploy")
        cls.compose_path = os.path.join(deploy, "docker-compose.yml")
        cls.env_path = os.path.join(deploy, ".env")
        with open(cls.compose_path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
        cls.compose = interpolate(raw, read_env(cls.env_path))

    def test_docker_compose_config_accepts_the_file(self):
        tool = shutil.which("docker-compose")
        if tool is None:
            self.skipTest("docker-compose is not installed (Debian package docker-compose)")
        result = subprocess.run(
            [tool, "--env-file", self.env_path, "-f", self.compose_path, "config", "--quiet"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)

    def specd_services(self):
        services = self.compose["services"]
        out = {name: s for name, s in services.items()
               if s.get("image") == read_env(self.env_path)["SPECD_IMAGE"]}
        self.assertEqual(sorted(out), ["coordinator", "draft-worker", "target-worker"])
        return out

    def check_command(self, where, command):
        binary = command[0]
        self.assertIn(binary, BINARIES, f"{where}: unknown binary {binary}")
        # `specd health ...`: the subcommand is part of the program.
        program = [BINARIES[binary]] + ([command[1]] if binary == "specd" else [])
        flags = command[len(program):]
        result = subprocess.run(program + ["--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 0, f"{where}: {result.stdout}{result.stderr}")
        usage = result.stdout + result.stderr
        for arg in flags:
            if arg.startswith("--"):
                name = arg[2:].split("=", 1)[0]
                self.assertRegex(usage, r"--" + re.escape(name) + r"\b",
                                 f"{where}: {binary} does not accept --{name}")

    def test_service_commands_use_flags_the_binaries_accept(self):
        for name, service in self.specd_services().items():
            self.check_command(f"service {name}", service["command"])

    def test_health_checks_run_specd_health(self):
        for name, service in self.specd_services().items():
            test = service["healthcheck"]["test"]
            self.assertEqual(test[0], "CMD", f"service {name}")
            self.assertEqual(test[1:3], ["specd", "health"], f"service {name}")
            self.check_command(f"health check of {name}", test[1:])

    def test_workers_share_one_gpu_and_stay_internal(self):
        services = self.specd_services()
        gpu_ids = set()
        for name in ("draft-worker", "target-worker"):
            s = services[name]
            self.assertNotIn("ports", s, f"{name} must not publish ports")
            self.assertEqual(s["networks"], ["internal"], name)
            devices = s["deploy"]["resources"]["reservations"]["devices"]
            gpu_ids.add(tuple(devices[0]["device_ids"]))
            self.assertIn("gpu", devices[0]["capabilities"])
        self.assertEqual(len(gpu_ids), 1, "the workers must reserve the same GPU")
        self.assertTrue(self.compose["networks"]["internal"]["internal"])

    def test_promtool_accepts_the_prometheus_config(self):
        tool = shutil.which("promtool")
        if tool is None:
            self.skipTest("promtool is not installed (Debian package prometheus)")
        path = os.path.join(SOURCE_DIR, "deploy", "prometheus", "prometheus.yml")
        result = subprocess.run([tool, "check", "config", path], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_prometheus_scrapes_all_three(self):
        with open(os.path.join(SOURCE_DIR, "deploy", "prometheus", "prometheus.yml"),
                  encoding="utf-8") as f:
            config = yaml.safe_load(f)
        targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
                   for t in sc["targets"]}
        self.assertEqual(targets, {"coordinator:9400", "draft-worker:9400", "target-worker:9400"})
        for name, service in self.specd_services().items():
            self.assertIn("--metrics-port=9400", service["command"], name)


if __name__ == "__main__":
    SOURCE_DIR = sys.argv[1]
    for arg in sys.argv[2:]:
        key, _, path = arg.partition("=")
        BINARIES[key] = path
    unittest.main(argv=[sys.argv[0]], verbosity=2)
