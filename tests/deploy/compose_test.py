#!/usr/bin/python3
"""Checks deploy/ against the built binaries, without a container engine (compose_stack_test.py
brings the stack up for real).

1. `docker-compose config` (Debian's docker-compose) accepts the file with deploy/.env, alone and
   with the GPU override, and promtool (Debian's prometheus) accepts
   deploy/prometheus/prometheus.yml.
2. Every specd service's command, and every health check, run with --help against the built
   binaries exits 0, and each --flag it passes is one the binary's --help lists, so compose never
   hands a binary a flag it rejects.
3. The targets deploy/Dockerfile builds are targets of this CMake build.

usage: compose_test.py SOURCE_DIR BUILD_DIR BIN=PATH...
       (e.g. specd-coordinator=/build/.../specd-coordinator)
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

SOURCE_DIR = ""
BUILD_DIR = ""
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
        cls.gpu_path = os.path.join(deploy, "docker-compose.gpu.yml")
        cls.env_path = os.path.join(deploy, ".env")
        env = read_env(cls.env_path)
        with open(cls.compose_path, encoding="utf-8") as f:
            cls.compose = interpolate(yaml.safe_load(f), env)
        with open(cls.gpu_path, encoding="utf-8") as f:
            cls.gpu = interpolate(yaml.safe_load(f), env)

    def test_docker_compose_config_accepts_the_files(self):
        tool = shutil.which("docker-compose")
        if tool is None:
            self.skipTest("docker-compose is not installed (Debian package docker-compose)")
        for extra in ([], ["-f", self.gpu_path]):
            result = subprocess.run(
                [tool, "--env-file", self.env_path, "-f", self.compose_path] + extra
                + ["config", "--quiet"], capture_output=True, text=True, timeout=60)
            self.assertEqual(result.returncode, 0, f"with {extra}: {result.stderr}")

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

    def test_workers_stay_internal(self):
        services = self.specd_services()
        for name in ("draft-worker", "target-worker"):
            s = services[name]
            self.assertNotIn("ports", s, f"{name} must not publish ports")
            self.assertEqual(s["networks"], ["internal"], name)
            # docker-compose 1.29 refuses to start an nvidia reservation on a host without a GPU.
            self.assertNotIn("deploy", s, f"{name}: device reservations belong in the GPU file")
        self.assertTrue(self.compose["networks"]["internal"]["internal"])

    def test_ports_are_published_on_loopback_only(self):
        published = {name: s["ports"] for name, s in self.compose["services"].items()
                     if "ports" in s}
        self.assertEqual(sorted(published), ["coordinator", "grafana", "prometheus"])
        for name, ports in published.items():
            for port in ports:
                self.assertTrue(port.startswith("127.0.0.1:"), f"{name} publishes {port}")
        self.assertEqual(self.compose["services"]["grafana"]["profiles"], ["grafana"])

    def test_gpu_file_reserves_one_gpu_for_both_workers(self):
        self.assertEqual(sorted(self.gpu["services"]), ["draft-worker", "target-worker"])
        gpu_ids = set()
        for name, s in self.gpu["services"].items():
            devices = s["deploy"]["resources"]["reservations"]["devices"]
            self.assertEqual(devices[0]["driver"], "nvidia", name)
            self.assertIn("gpu", devices[0]["capabilities"], name)
            gpu_ids.add(tuple(devices[0]["device_ids"]))
        self.assertEqual(len(gpu_ids), 1, "the workers must reserve the same GPU")

    def test_dockerfile_builds_targets_of_this_build(self):
        with open(os.path.join(SOURCE_DIR, "deploy", "Dockerfile"), encoding="utf-8") as f:
            dockerfile = f.read().replace("\\\n", " ")
        match = re.search(r"cmake --build \S+ .*?--target ((?:[\w-]+ ?)+)", dockerfile)
        self.assertIsNotNone(match, "deploy/Dockerfile builds no --target")
        targets = match.group(1).split()
        self.assertEqual(len(targets), 4, targets)
        result = subprocess.run(["cmake", "--build", BUILD_DIR, "--target", "help"],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        # Makefiles list "... NAME", Ninja "NAME: phony".
        known = {line[4:].split()[0] if line.startswith("... ") else line.split(":")[0]
                 for line in result.stdout.splitlines() if line.strip()}
        for target in targets:
            self.assertTrue(target in known, f"deploy/Dockerfile builds --target {target}, "
                                             "which this CMake build does not define")

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
    SOURCE_DIR, BUILD_DIR = sys.argv[1:3]
    for arg in sys.argv[3:]:
        key, _, path = arg.partition("=")
        BINARIES[key] = path
    unittest.main(argv=[sys.argv[0]], verbosity=2)
