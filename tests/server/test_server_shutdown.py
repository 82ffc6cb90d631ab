"""A stop that reaches the whole process group (Ctrl-C, or a service manager's SIGTERM to every process of the
unit) shuts the server down cleanly: every process exits and nothing is logged as an error."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.helpers.server_util import Server


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_sent_to_the_process_group_is_clean(pair, tmp_path, sig):
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        srv = Server(["-m", str(pair.target), "-md", str(pair.drafter), "-np", "2", "-c", "512", "-v"], log=log)
        try:
            client = srv.openai()
            out = client.completions.create(model=client.models.list().data[0].id, prompt="hello", max_tokens=8,
                                            temperature=0)
            assert out.usage.completion_tokens == 8
            group = os.getpgid(srv.proc.pid)
            assert srv.engine_pids(), "no engine process to stop"
            os.killpg(group, sig)
            assert srv.proc.wait(timeout=30) is not None
            left = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
            assert not left, f"processes left in the server's group: {left}"
        finally:
            srv.stop()
    text = log_path.read_text(errors="replace")
    assert " ERROR " not in text and "Traceback" not in text, text[-2000:]
