"""The fenced examples of the Markdown docs, collected and run as a reader would run them.

The convention (docs/contributing-docs.md says it for writers):
- A ```python, ```sh, ```bash, ```shell or ```console block runs; other languages do not.
- `<!-- not-run: REASON -->` on the last non-blank line before a block skips it, for the
  reason given (hardware, systemd, root, a fragment of a larger example). A reason is required.
- A block whose first line is `# file: PATH` is written to PATH in the page's workspace
  instead of run; the blocks after it import it, and the daemon runs jobs from it.
- A page's blocks run in order in one workspace (a fresh directory: its current directory,
  the daemon's --app-dir, first on sys.path), against one daemon whose port QUEICKD_PORT
  names (so `JobQueue()` and `queick ...` reach it), started only for a page that has a
  block to run. `queick` on PATH is this checkout's.
- A ```console block runs its `$ ` lines; the other lines are output, not compared.
- After the blocks, the `# file: test_*.py` files of the page run under pytest.

Parses and runs; knows nothing of pytest's collection (tests/test_docs_examples.py does that).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RUN_LANGS = ("python", "sh", "bash", "shell", "console")
SHELL_LANGS = ("sh", "bash", "shell", "console")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)")
_NOT_RUN = re.compile(r"^<!--\s*not-run:(?P<reason>.*?)-->$")
_FILE = re.compile(r"^#\s*file:\s*(?P<path>\S+)\s*$")
BLOCK_TIMEOUT = 90.0


class ExampleError(Exception):
    """A block that failed, or a page that breaks the convention; the message names file:line."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the line of the opening fence, from 1
    lang: str
    code: str
    not_run: str | None = None  # the reason, when marked not-run

    @property
    def file(self) -> str | None:
        """The PATH of a `# file: PATH` block."""
        first = self.code.split("\n", 1)[0].strip()
        m = _FILE.match(first)
        return m.group("path") if m else None

    def where(self, root: Path) -> str:
        try:
            name = self.path.resolve().relative_to(root.resolve())
        except ValueError:
            name = self.path
        return f"{name}:{self.line}"


def collect(path: Path) -> list[Block]:
    """Every fenced block of the page, with its language and not-run reason."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        out.append(Block(path, i + 1, lang, "\n".join(body) + "\n", _marker(path, lines, i)))
        i = j + 1
    return out


def _marker(path: Path, lines: list[str], fence: int) -> str | None:
    k = fence - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0:
        return None
    text = lines[k].strip()
    if "not-run" not in text:
        return None
    m = _NOT_RUN.match(text)
    if not m or not m.group("reason").strip():
        raise ExampleError(f"{path}:{k + 1}: write the marker as <!-- not-run: REASON --> with a reason")
    return m.group("reason").strip()


def to_run(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang in RUN_LANGS and b.not_run is None]


def needs_daemon(blocks: list[Block]) -> bool:
    return any(b.file is None for b in to_run(blocks))


def run_page(blocks: list[Block], workspace: Path, root: Path, port: int | None) -> None:
    """Run the page's blocks in order in `workspace`; raise ExampleError at the first failure."""
    bindir = workspace / ".bin"
    bindir.mkdir(exist_ok=True)
    queick = bindir / "queick"
    queick.write_text(f"#!/bin/sh\nexec {sys.executable} -m queickd \"$@\"\n")
    queick.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEICKD_", "PYTEST_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(workspace), str(root)]), QUEICKD_HOST="127.0.0.1")
    if port is not None:
        env["QUEICKD_PORT"] = str(port)
    tests: list[Path] = []
    for b in to_run(blocks):
        where = b.where(root)
        if b.file is not None:
            target = (workspace / b.file).resolve()
            if workspace.resolve() not in target.parents:
                raise ExampleError(f"{where}: # file: {b.file} is outside the page's workspace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(b.code)
            if target.name.startswith("test_") and target.suffix == ".py":
                tests.append(target)
            continue
        _run(where, b, _command(b, workspace), workspace, env)
    if tests:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               "--rootdir", str(workspace), *map(str, tests)]
        first = next(b for b in blocks if b.file and (workspace / b.file).resolve() == tests[0])
        _run(f"{first.where(root)} (its test files under pytest)", first, cmd, workspace, env)


def _command(b: Block, workspace: Path) -> list[str]:
    if b.lang == "python":
        script = workspace / f".block_{b.line}.py"
        script.write_text(b.code)
        return [sys.executable, str(script)]
    code = b.code
    if b.lang == "console":
        code = "\n".join(ln[2:] for ln in code.splitlines() if ln.startswith("$ ")) + "\n"
    return ["bash", "-e", "-o", "pipefail", "-c", code]


def _run(where: str, b: Block, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                   stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ExampleError(f"{where}: the ```{b.lang} block ran past {BLOCK_TIMEOUT:g}s\n{b.code}") from None
    if r.returncode != 0:
        raise ExampleError(
            f"{where}: the ```{b.lang} block failed (exit {r.returncode}); fix it, or mark it "
            f"<!-- not-run: REASON --> on the line before\n--- block ---\n{b.code}--- output ---\n"
            f"{r.stdout}{r.stderr}")
