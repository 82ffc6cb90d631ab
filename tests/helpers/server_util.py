"""A real pydflash-server on loopback for the server tests: its own process group, a free port, a models.toml."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_models_toml(path: pathlib.Path, presets: dict[str, dict], default: str | None = None) -> pathlib.Path:
    lines = [f'default = "{default}"', ""] if default else []
    for name, table in presets.items():
        lines.append(f'["{name}"]')
        for k, v in table.items():
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, (int, float)):
                lines.append(f"{k} = {v}")
            else:
                lines.append(f'{k} = "{v}"')
        lines.append("")
    path.write_text("\n".join(lines))
    return path


class Server:
    def __init__(self, args: list[str], api_key: str | None = None, ready_timeout: float = 120.0, log=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "pydflash.cli.server", "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each server aggregates its own workers only
        self.log = log or open(os.devnull, "wb")
        # a process group of its own: the router and its workers go down together at the end
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pydflash-server exited with status {self.proc.returncode}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("pydflash-server did not become healthy in time")

    def openai(self, **kw):
        import openai

        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "unused", **kw)

    def http(self, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        kw.setdefault("timeout", 60)
        return httpx.Client(base_url=self.base, headers=headers, **kw)

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples of one metric whose labels include these."""
        text = self.http().get("/metrics").text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric_name = head.split("{", 1)[0]
            if metric_name != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def worker_pids(self) -> list[int]:
        return self._pids("pydflash.server.worker")

    def engine_pids(self) -> list[int]:
        """The workers' engine processes (server/engine_process.py)."""
        return self._pids("pydflash.server.engine_process")

    def _pids(self, module: str) -> list[int]:
        out = subprocess.run(["pgrep", "-f", "-g", str(os.getpgid(self.proc.pid)), module],
                             capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
