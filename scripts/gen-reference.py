#!/usr/bin/env python3
"""Write the generated reference pages of the docs (docs/reference/*.md) from the code.

    python3 scripts/gen-reference.py            # rewrite docs/reference/
    python3 scripts/gen-reference.py --check    # exit 1 naming each page that is out of date
    python3 scripts/gen-reference.py --out DIR  # write the pages into DIR instead

Each page is read from the one place the code declares its facts: the CLI and the config
file from the argparse parser (queickd/cli/parser.py; a file key is a `queick run` flag),
the protocol from core/protocol.py and core/fields.py, the metrics from what
ui/metrics.py renders, the Python API from queickd.__all__ (as mkdocstrings directives).
tests/test_docs_reference.py fails when a committed page differs from what this writes.
Standard library only; never run by the daemon. QUEICKD_* variables are ignored, so a
page does not depend on the shell it is generated in.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python3 scripts/gen-reference.py"
PAGES = ("cli.md", "config.md", "protocol.md", "metrics.md", "python.md")

for _name in [n for n in os.environ if n.startswith("QUEICKD_")]:
    del os.environ[_name]  # the parser takes its defaults from them
sys.path.insert(0, str(ROOT))

from queickd import config as config_file  # noqa: E402
from queickd.cli import options  # noqa: E402
from queickd.cli.parser import build_parser  # noqa: E402
from queickd.core import fields, protocol  # noqa: E402


def _header(title: str, source: str) -> list[str]:
    return [f"# {title}", "",
            f"<!-- Generated from {source} by `{COMMAND}`: edit the code, then regenerate. -->", ""]


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    s = " ".join(str(text).split())
    for raw, esc in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        s = s.replace(raw, esc)
    return s


def _code(text: object) -> str:
    s = str(text).replace("|", "\\|")
    return f"``{s}``" if "`" in s else f"`{s}`"


# --- the command line ----------------------------------------------------------------------

def _subparsers(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of p's commands, in the order --help lists them."""
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in act._choices_actions}
            return [(name, sp, helps.get(name, "")) for name, sp in act.choices.items()]
    return []


def _default(act: argparse.Action) -> str:
    d = act.default
    if d is None or d is argparse.SUPPRESS or d is False or d == [] or d == {} or d == "":
        return ""
    if act.type is options.duration and isinstance(d, int | float):
        return _code(options.fmt_duration(d))
    if isinstance(d, list):
        return _code(",".join(map(str, d)))
    return _code(d)


def _value(act: argparse.Action) -> str:
    if act.nargs == 0 or isinstance(act, argparse._StoreConstAction | argparse._StoreTrueAction):
        return ""
    if act.choices is not None:
        return " \\| ".join(_code(c) for c in act.choices)
    meta = act.metavar or (act.dest if not act.option_strings else act.dest.upper())
    if isinstance(meta, tuple):  # several values (nargs=N), one name each
        meta = " ".join(meta)
    return _code(meta + (" (optional)" if act.nargs == "?" and act.option_strings else ""))


def _split_help(act: argparse.Action) -> tuple[str, str]:
    """(help without the default and variable cli/options.opt appends, the variable)."""
    text = act.help or ""
    m = re.search(r" \[env (QUEICKD_\w+)\]$", text)
    env = m.group(1) if m else ""
    text = text[:m.start()] if m else text
    if _default(act):
        text = re.sub(r" \(default: [^()]*\)$", "", text)
    return text, env


def _arguments(p: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for group in p._action_groups:
        acts = [a for a in group._group_actions
                if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]
        if not acts:
            continue
        title = {"positional arguments": "Arguments", "options": "Flags"}.get(group.title or "", group.title)
        out += [f"**{title}**" + (f": {group.description}" if group.description else ""), ""]
        out += ["| Argument | Value | Default | Description |", "|---|---|---|---|"]
        for a in acts:
            name = ", ".join(_code(o) for o in a.option_strings) or _code(a.dest.upper())
            req = " (required)" if a.required and a.option_strings else ""
            text, env = _split_help(a)
            env = f"<br>{_code(env)}" if env else ""
            out.append(f"| {name}{req}{env} | {_value(a)} | {_default(a)} | {_cell(text)} |")
        out.append("")
    return out


def _command(path: str, p: argparse.ArgumentParser, help: str) -> list[str]:
    out = [f"## `{path}`", ""]
    text = p.description or help
    if text:
        out += [_cell(text), ""]
    out += _arguments(p)
    for name, sp, sub_help in _subparsers(p):
        out += _command(f"{path} {name}", sp, sub_help)
    return out


def cli_page() -> str:
    from queickd.attendance.cli import build_parser as attendance_parser

    p = build_parser()
    out = _header("Command line: `queick`", "the argparse parser (queickd/cli/parser.py)")
    out += [_cell(p.description), "", "Every flag of `run` and `worker` also reads the variable "
            "named after it (`QUEICKD_` and the flag in capitals, `--max-queued` → `QUEICKD_MAX_QUEUED`); "
            "a flag given beats it, and it beats the config file.", ""]
    out += ["| Command | What it does |", "|---|---|"]
    cmds = _subparsers(p)
    out += [f"| [`queick {n}`](#queick-{n}) | {_cell(h)} |" for n, _, h in cmds]
    out.append("")
    out += _arguments(p)
    for name, sp, help in cmds:
        if name == "attendance":
            out += _command("queick attendance", attendance_parser(), help)
        else:
            out += _command(f"queick {name}", sp, help)
    return "\n".join(out).rstrip() + "\n"


# --- the config file ---------------------------------------------------------------------

def _run_parser() -> argparse.ArgumentParser:
    return next(sp for name, sp, _ in _subparsers(build_parser()) if name == "run")


def config_page() -> str:
    run = _run_parser()
    out = _header("Config file", "the `queick run` parser (queickd/cli/parser.py) and queickd/config.py")
    out += [_cell((config_file.__doc__ or "").split("Reads TOML")[0]), "",
            "A key is written with dashes or underscores (`max-queued = 50` or `max_queued = 50`). "
            "A repeatable flag takes a list (`pool = [\"a\", \"b\"]`) or one string.", "",
            "| Key | Default | Flag | Environment | Description |", "|---|---|---|---|---|"]
    for a in run._actions:
        if not a.option_strings or a.dest in ("help", "config"):
            continue  # the file may name every flag's destination but these (config.load)
        flag = next(o for o in a.option_strings if o.startswith("--") or o.startswith("-"))
        text, env = _split_help(a)
        out.append(f"| `{a.dest.replace('_', '-')}` | {_default(a)} | {_code(flag)} | "
                   f"{_code(env) if env else ''} | {_cell(text)} |")
    out += ["", "**Tables** (passed on as they are read; each is checked where it is used):", ""]
    out += [f"- `[{t}]`" if t in config_file.SECTIONS else f"- `[{t}.NAME]`" for t in config_file.TABLES]
    from queickd.services.forwarder.settings import KEYS

    out += ["", "**`[upstream]`**: the daemon this one forwards jobs to (an edge daemon), from "
            "queickd/services/forwarder/settings.py:", "", "| Key | Description |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in KEYS.items()]
    return "\n".join(out).rstrip() + "\n"


# --- the wire protocol -------------------------------------------------------------------

def _comments(path: Path) -> dict[int, tuple[int, str]]:
    """Line number → (spaces after its #, text) of the comment on it."""
    out: dict[int, tuple[int, str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT:
            body = tok.string.lstrip("#")
            out[tok.start[0]] = (len(body) - len(body.lstrip(" ")), body.strip())
    return out


def _constants(path: Path, names: set[str]) -> list[tuple[str, str]]:
    """(name, comment) of the module-level constants `names`, in source order: the comment on
    their line, else the comment lines right above."""
    comments, src = _comments(path), path.read_text().splitlines()
    out = []
    for node in ast.parse("\n".join(src)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in names:
            text = comments.get(node.lineno, (0, ""))[1]
            if not text:
                above, n = [], node.lineno - 1
                while n in comments and src[n - 1].lstrip().startswith("#"):
                    above.insert(0, comments[n][1])
                    n -= 1
                text = " ".join(above)
            out.append((node.targets[0].id, text))
    return out


def _field_notes() -> dict[str, str]:
    """Field name → the comments written on its Field(...) lines in core/fields.py."""
    path = ROOT / "queickd/core/fields.py"
    comments, src = _comments(path), path.read_text().splitlines()
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Field" and node.args \
                and isinstance(node.args[0], ast.Constant):
            end = node.end_lineno or node.lineno
            notes = [comments[n][1] for n in range(node.lineno, end + 1) if n in comments]
            n = end + 1  # a comment goes on below the call on lines aligned with it ("#      more")
            while n in comments and comments[n][0] > 1 and src[n - 1].lstrip().startswith("#"):
                notes.append(comments[n][1])
                n += 1
            out[node.args[0].value] = " ".join(notes)
    return out


def protocol_page() -> str:
    out = _header("Wire protocol", "queickd/core/protocol.py and queickd/core/fields.py")
    out += [_cell(protocol.__doc__), "", "A request is one JSON object on one line with an `op` and the "
            "fields of that op; any other field is refused (`bad_request`).", "", "## Limits", "",
            "| Name | Value | Meaning |", "|---|---|---|"]
    limits = {"VERSION", "DEFAULT_PORT", "MAX_LINE", "MAX_KEY_LEN", "MAX_BATCH", "MAX_INT", "MAX_ID",
              "MAX_COST_UNITS", "MAX_DEPTH"}
    for name, text in _constants(ROOT / "queickd/core/protocol.py", limits):
        out.append(f"| `{name}` | `{getattr(protocol, name)}` | {_cell(text)} |")
    out += ["", "## Operations", "", "| Op | Fields (besides `op`) |", "|---|---|"]
    for op, names in protocol.OPS.items():
        out.append(f"| `{op}` | {', '.join(_code(n) for n in sorted(names)) or '(none)'} |")
    out += ["", "## Error codes", "", _cell(protocol.Code.__doc__), "", "| Code |", "|---|"]
    out += [f"| `{v}` |" for k, v in vars(protocol.Code).items() if k.isupper()]
    out += ["", "## The job record", "", "A job's fields as `get`, `jobs` and `wait` return them, in this "
            "order. *Enqueue*: an `enqueue` request may set it (`delay` too: `run_at` relative to now). "
            "*Template*: a cron's and an event's job template keeps it.", "",
            "| Field | Type | Default | Enqueue | Template | Notes |", "|---|---|---|---|---|---|"]
    notes = _field_notes()
    for f in fields.FIELDS:
        default = "" if f.default is fields.NO_DEFAULT else _code(f.fresh_default())
        out.append(f"| `{f.wire_name}` | {_code(f.type)} | {default} | {'yes' if f.enqueue else ''} | "
                   f"{'yes' if f.template else ''} | {_cell(notes.get(f.name, ''))} |")
    return "\n".join(out).rstrip() + "\n"


# --- metrics -----------------------------------------------------------------------------

def _every_family_stats() -> dict:
    """A detailed `stats` reply in which every optional part is present, so render() emits
    every family it can."""
    member = {"member": "m", "completed": 1, "failed": 1, "seconds": 1.0}
    return {
        "counts": {}, "oldest_queued_at": None, "waiting_by_key": [{"key": "k", "waiting": 1, "oldest_run_at": 0.0}],
        "workers": {"busy": 0, "total": 1}, "running_without_worker": 0,
        "pools": {"default": {"workers": 1, "waiting": 0}},
        "budgets": [{"kind": "pool", "name": "p", "limit": 1, "running": 0, "waiting": 0}],
        "memory": {"deferred": {"memory": 1}}, "events": {"pending": 0, "dead": 0},
        "outbox_oldest_pending_at": None, "last_hour": {"members": [member]},
        "paused": [{"kind": "key", "name": "k", "probe_at": 1.0}], "draining": False,
        "workflows": {"runs": {"running": 1}, "budget_stops": {"b": 1}}, "store_problem": None,
        "scheduler": {"alive": True, "last_fired_at": None}, "network": None,
        "sandbox": {"runs": {"thread": 1}, "kills": {"timeout": 1}, "crashed": 0,
                    "zygote": {"alive": True, "restarts": 0}, "limits": {"memory": "rss"}},
        "progress": {"offered": 0, "written": 0, "batches": 0}, "refused": 0, "uptime": 1.0,
        "upstream": {"link": "up", "held": 0, "held_bytes": 0, "oldest_held_age": None, "last_forward_at": None,
                     "forwarded": 0, "refused": 0, "wakeups": 0},
        "liveness": {"stalled": 0, "watched": 0, "stalls": {"mark": 0, "kill": 0}},
        "rate_keys": [{"key": "k", "limit": 1, "per": 1.0, "used": 0, "next_start": 0.0, "blocked_until": 1.0}],
        "fair_keys": [{"pool": "default", "key": "k", "waiting": 1, "vtime": 0.0, "last_start": 0.0}],
    }


def _histogram() -> object:
    from queickd.ui import metrics

    return metrics._Histogram()


def metrics_page() -> str:
    from queickd.ui.metrics import BUCKETS, Metrics

    m = Metrics(clock=lambda: 0.0)
    m.enqueued["f"] = m.completed["f"] = m.failed["f"] = m.hook_deliveries["h"] = 1  # labelled samples
    m.durations["f"] = _histogram()
    text = m.render(_every_family_stats())
    helps = {}
    kinds = {}
    labels: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, h = line[len("# HELP "):].partition(" ")
            helps[name] = h
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            kinds[name] = kind
        elif "{" in line:
            name, _, rest = line.partition("{")
            for fam in (name, name.rsplit("_", 1)[0]):
                if fam in helps:
                    for pair in rest.split("}")[0].split(","):
                        lab = pair.split("=")[0]
                        if lab and lab != "le" and lab not in labels.setdefault(fam, []):
                            labels[fam].append(lab)
    out = _header("Metrics", "what queickd/ui/metrics.py renders")
    out += ["`GET /metrics` on the HTTP listener (`queick run --http`) answers in the Prometheus text "
            "format. The families below are every one it can emit; those about process jobs "
            "(`queickd_runs_total` and the ones after it) appear once the runner reports them.", "",
            f"The run-duration histogram's buckets (seconds): {', '.join(map(str, BUCKETS))}.", "",
            "| Family | Type | Labels | Help |", "|---|---|---|---|"]
    for name, h in helps.items():
        out.append(f"| `{name}` | {kinds[name]} | {', '.join(_code(x) for x in labels.get(name, []))} | {_cell(h)} |")
    return "\n".join(out).rstrip() + "\n"


# --- the Python API ----------------------------------------------------------------------

def python_page() -> str:
    import queickd

    out = _header("Python API", "`queickd.__all__` (rendered from the docstrings by mkdocstrings)")
    out += ["Everything `from queickd import ...` offers. The client names import nothing outside "
            "the standard library.", ""]
    for name in queickd.__all__:
        if name.startswith("__"):
            continue
        # A name the package loads on first use (AsyncJobQueue) is not in its static
        # namespace, where mkdocstrings looks: name it by the module that defines it.
        path = f"queickd.{name}" if name in vars(queickd) else f"{getattr(queickd, name).__module__}.{name}"
        out += [f"::: {path}", ""]
    out += ["`queickd.__version__` is the installed version (`queick --version` prints it)."]
    return "\n".join(out).rstrip() + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "cli.md": cli_page, "config.md": config_page, "protocol.md": protocol_page,
    "metrics.md": metrics_page, "python.md": python_page,
}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Write docs/reference/*.md from the code.")
    ap.add_argument("--out", default=str(ROOT / "docs" / "reference"), help="directory to write into")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    a = ap.parse_args(argv)
    out = Path(a.out)
    stale = []
    for page, make in GENERATORS.items():
        text = make()
        target = out / page
        if a.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(os.path.relpath(target))
            continue
        out.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for path in stale:
        print(f"{path} is out of date: run {COMMAND}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
