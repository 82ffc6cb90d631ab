"""The README and docs/usage.md stay true: every ```python snippet runs, and their pydflash-speculative and
pydflash-server flags are the real ones.

Snippets run as they are written, each in its own interpreter (a snippet that crashes the process fails here
instead of taking pytest down). The GGUF names a snippet uses ("target.gguf", "drafter.gguf") are files in the
snippet's working directory, linked to the tiny factory pair: names with "draft" in them to the drafter, the rest
to the target.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
USAGE = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")  # the full flag tables and the models.toml sample
DOCS = README + "\n" + USAGE
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def fenced(lang: str, text: str = DOCS) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def section(title: str, text: str = USAGE) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end > 0 else None]


SNIPPETS = fenced("python")


def test_readme_has_python_snippets():
    assert fenced("python", README), "no ```python block found in README.md"


SERVER_URL = "http://127.0.0.1:8080"


@pytest.fixture(scope="module")
def server_url(tiny, tmp_path_factory):
    """A pydflash-server for the snippets that talk to one (on its own free port, substituted for 8080)."""
    from tests.helpers.server_util import Server, write_models_toml

    pair = tiny("gemma3")
    cfg = write_models_toml(tmp_path_factory.mktemp("readme") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": 512}})
    srv = Server(["--config", str(cfg)])
    yield srv.base
    srv.stop()


@pytest.mark.parametrize("i", range(len(SNIPPETS)))
def test_python_snippet_runs(i, tiny, tmp_path, request):
    code = SNIPPETS[i]
    if SERVER_URL in code:
        code = code.replace(SERVER_URL, request.getfixturevalue("server_url"))
    pair = tiny("gemma3")
    for name in set(re.findall(r"""["']([\w.-]+\.gguf)["']""", code)):
        (tmp_path / name).symlink_to(pair.drafter if "draft" in name else pair.target)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"README snippet {i} exited {r.returncode}:\n{code}\n--- stderr:\n{r.stderr[-3000:]}"


def help_options() -> list[list[str]]:
    """The option strings of `pydflash-speculative --help`, one list per option."""
    out = subprocess.run([sys.executable, "-m", "pydflash.cli.speculative", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    body = out.stdout[out.stdout.index("options:"):]
    opts = []
    for line in body.splitlines():
        m = re.match(r"^  (-\S.*?)(?:  |$)", line)
        if m:
            opts.append([part.split()[0] for part in m.group(1).split(", ")])
    return opts


def table_flags() -> set[str]:
    """Flags named in the first column of the README's pydflash-speculative flag table."""
    rows = [ln for ln in section("## CLI: `pydflash-speculative`").splitlines() if ln.startswith("| `")]
    assert rows, "no flag table in docs/usage.md's CLI section"
    return {f for row in rows for f in FLAG.findall(row.split("|")[1])}


def test_flag_table_matches_help():
    opts = help_options()
    real = {s for o in opts for s in o}
    assert "--top-k" in real and "--json" in real  # the help parsed
    documented = table_flags()
    assert documented - real == set(), "docs/usage.md documents flags the CLI does not have"
    undocumented = [o for o in opts if o != ["-h", "--help"] and not set(o) & documented]
    assert undocumented == [], "flags missing from docs/usage.md's table"


def test_sh_examples_use_real_flags():
    real = {s for o in help_options() for s in o}
    for block in fenced("sh"):
        for line in block.splitlines():
            if "pydflash-speculative" in line:
                cmd = line.split("#")[0].split("pydflash-speculative", 1)[1]
                cmd = re.sub(r'"[^"]*"', "", cmd)  # flag-like text inside a quoted prompt is not a flag
                assert set(FLAG.findall(cmd)) <= real, line


def test_models_toml_sample_is_valid(tmp_path):
    from pydflash.server.preset import ServerModels

    (block,) = fenced("toml", USAGE)
    cfg = tmp_path / "models.toml"
    cfg.write_text(block)
    models = ServerModels.from_toml(cfg)
    assert models.default == "gemma" and set(models.presets) == {"gemma", "coder"}
    assert models.presets["coder"].target == str(tmp_path / "models/qwen3-4b-q4_k_m.gguf")


def test_server_flags_in_readme_exist():
    out = subprocess.run([sys.executable, "-m", "pydflash.cli.server", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO).stdout
    used = {f for block in fenced("sh") for line in block.splitlines() if "pydflash-server" in line
            for f in FLAG.findall(line.split("pydflash-server", 1)[1])}
    assert used and all(f in out for f in used), used
