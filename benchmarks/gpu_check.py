#!/usr/bin/env python
"""Every CUDA path of hf_distprof, checked on one GPU in under 8 minutes: one command, one report.

    python benchmarks/gpu_check.py --dry-run --out gpu_check_out    # any machine: the plan, every flag checked
    python benchmarks/gpu_check.py --out gpu_check_out              # on the GPU machine, from the repository root

Each check runs its commands as subprocesses with timeouts (the budgets add up to under 8 minutes, so a retry
fits in the same slot) and reads numbers back from the files they write; a failed check does not stop the next.
``<out>/gpu_check.json`` holds one record per check (name, passed, numbers, seconds, error), ``gpu_check.md`` the
same as a table, both rewritten after every check; each command's output is in ``<out>/logs/``. ``--dry-run``
prints the plan (each check's model and parameter count, its budget, the total) and checks, for real, that every
script exists, every flag is in its command's help, every test hook variable is read by its script and every
``hf_distprof`` name the inline programs import exists. Without CUDA the run exits 2. DEVELOPING.md ("Running the
GPU check") says which wheels to bring to a GPU machine without network.

The checks are in ``gpu_check_checks.py``, what they are built from in ``gpu_check_core.py``, the inline programs
in ``gpu_check_snippets.py``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, also when loaded from a file by a test

from gpu_check_checks import CHECKS  # noqa: E402
from gpu_check_core import (  # noqa: E402, F401 - the names the tests and the checks share
    BASE_ENV,
    REPO,
    TOOLS,
    Check,
    CheckFailed,
    Cmd,
    Ctx,
    Model,
    Result,
    Shell,
    Tool,
    expect,
    last_json,
    run_cmd,
    succeeded,
)
from gpu_check_snippets import SNIPPETS  # noqa: E402

TOTAL_LIMIT_S = 480.0
"""The whole run must fit in 8 minutes; a check whose budget would pass that is skipped, saying so."""
OWN_PATHS = ("traces", "report", "hta_traces", "sync", "oom", "nsys", "logs", "hta.json", "memory_snapshot.html",
             "pytest_gpu.xml")
"""What a real run clears first in ``--out``: a run name already taken would get a -1 suffix, and a file left by
an earlier run must not pass for this one's. ``train/`` stays (the demo tokenizer, trained once)."""


# ---- the dry run ----------------------------------------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_text(tool: Tool) -> str:
    """What ``tool``'s help command prints (RuntimeError when it fails)."""
    assert tool.help_argv is not None
    proc = subprocess.run(tool.help_argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **BASE_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"`{shlex.join(tool.help_argv)}` exited with status {proc.returncode}: {proc.stderr[-500:]}")
    return proc.stdout + proc.stderr


def installed(tool: Tool) -> bool:
    """Whether the tool's program is on this machine."""
    return shutil.which(tool.argv[0]) is not None


def snippet_problems(name: str) -> list[str]:
    """What is wrong with one inline program: unknown, not Python, or importing an ``hf_distprof`` name that is gone."""
    if name not in SNIPPETS:
        return [f"no snippet named {name!r}"]
    try:
        tree = ast.parse(SNIPPETS[name])
    except SyntaxError as err:
        return [f"{name}: {err}"]
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and str(n.module).startswith("hf_distprof")]
    return [f"{name}: {node.module} has no {alias.name}" for node in imports for alias in node.names
            if not hasattr(importlib.import_module(node.module or ""), alias.name)]


HelpOf = Callable[[Tool], str]


def validate(checks: Sequence[Check], ctx: Ctx, help_of: HelpOf = help_text) -> tuple[list[str], list[str]]:
    """Check every command of the plan against this machine and the repository, without running any.

    Args:
        checks: The checks.
        ctx: Where the run would write.
        help_of: The help text of a tool (tests pass a fake).

    Returns:
        The problems, each naming its check, and notes on what could not be checked here.
    """
    plans = [check.plan(ctx) for check in checks]
    used = {TOOLS[n] for cmds in plans for c in cmds for n in (c.tool, *(c.via[:1] if c.via else ())) if n in TOOLS}
    problems: list[str] = []
    notes: set[str] = set()
    accepted: dict[tuple[str, ...] | None, set[str]] = {}

    def fetch(tool: Tool) -> None:
        try:
            accepted[tool.help_argv] = set(FLAG.findall(help_of(tool)))
        except Exception as err:  # noqa: BLE001 - a problem of the plan, reported with the others
            problems.append(f"cannot list the flags of `{shlex.join(tool.argv)}`: {err}")

    with ThreadPoolExecutor(max_workers=4) as pool:  # the help commands mostly wait for imports
        list(pool.map(fetch, {t.help_argv: t for t in used if t.help_argv and installed(t)}.values()))
    for i, (check, cmds) in enumerate(zip(checks, plans), 1):
        where = f"check {i} ({check.name})"
        for cmd in cmds:
            for name, args in [(cmd.tool, cmd.args), *([cmd.via] if cmd.via else [])]:
                tool = TOOLS.get(name)
                if tool is None:
                    problems.append(f"{where}: no tool {name!r}")
                    continue
                problems += [f"{where}: {src} does not exist" for src in tool.sources if not (REPO / src).is_file()]
                if not installed(tool):
                    notes.add(f"{where}: {tool.argv[0]} is not installed here; its flags are not checked")
                elif tool.help_argv in accepted:
                    flags = [a.split("=", 1)[0] for a in args if FLAG.fullmatch(a.split("=", 1)[0])]
                    problems += [f"{where}: {flag} is not a flag of `{shlex.join(tool.argv)}` (not in its help)"
                                 for flag in flags if flag not in accepted[tool.help_argv]]
            texts = [(REPO / s).read_text(encoding="utf-8") for s in TOOLS[cmd.tool].sources if (REPO / s).is_file()]
            problems += [f"{where}: no script of {cmd.tool} reads {key}" for key in cmd.env
                         if texts and not any(key in text for text in texts)]
            problems += [f"{where}: {p}" for p in snippet_problems(cmd.args[0])] if cmd.tool == "snippet" else []
    return problems, sorted(notes)


def dry_run(checks: Sequence[Check], ctx: Ctx, help_of: HelpOf = help_text, limit_s: float = TOTAL_LIMIT_S) -> int:
    """Print the numbered plan (each check's budget and models) and validate it: 0 when every script, command and
    flag exists, else 1."""
    total = sum(c.budget_s for c in checks)
    print(f"gpu_check plan: {len(checks)} checks, budget {total:.0f} s (limit {limit_s:.0f} s), out {ctx.out}")
    for i, check in enumerate(checks, 1):
        print(f"{i:2d}. {check.name} ({check.budget_s:.0f} s): {check.what}")
        for model in check.models or (Model("none"),):
            print(f"      model: {model.describe()}")
        for cmd in check.plan(ctx):
            print(f"      {cmd.display()}")
    problems, notes = validate(checks, ctx, help_of)
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print(f"total budget: {total:.0f} s for {len(checks)} checks (limit {limit_s:.0f} s)")
    print(f"dry run: {sum(len(c.plan(ctx)) for c in checks)} commands checked, {len(problems)} problem(s)")
    return 1 if problems else 0


# ---- the real run ---------------------------------------------------------------------------------------------


def shell_for(out: Path, number: int, name: str) -> Shell:
    """How check ``number`` runs its commands: offline, each into its own ``<out>/logs/NN_<check>_K.log``."""
    counter, slug = itertools.count(1), re.sub(r"\W+", "_", name)
    return lambda cmd: run_cmd(replace(cmd, env={**BASE_ENV, **cmd.env}),
                               out / "logs" / f"{number:02d}_{slug}_{next(counter)}.log")


def run_checks(checks: Sequence[Check], ctx: Ctx, limit_s: float = TOTAL_LIMIT_S) -> list[Result]:
    """Run every check in order, each past the failures of the others, writing the results after each one; a check
    whose budget would end past ``limit_s`` from the start is skipped."""
    results: list[Result] = []
    models = [", ".join(m.describe() for m in check.models) for check in checks]  # counted before the clock starts
    start = time.monotonic()
    for i, check in enumerate(checks, 1):
        numbers: dict[str, Any] = {}
        passed, error, began = False, None, time.monotonic()
        print(f"[{i}/{len(checks)}] {check.name} (budget {check.budget_s:.0f} s)"
              + (f" on {models[i - 1]}" if models[i - 1] else ""), flush=True)
        if began - start + check.budget_s > limit_s:
            error = f"skipped: its {check.budget_s:.0f} s would pass the run's {limit_s:.0f} s limit"
        else:
            try:
                check.run(ctx, check.plan(ctx), numbers, shell_for(ctx.out, i, check.name))
                passed = True
            except CheckFailed as err:
                error = str(err)
            except Exception as err:  # noqa: BLE001 - a file or field missing: this check fails, the next one runs
                error = f"{type(err).__name__}: {err}"
        results.append(Result(check.name, passed, numbers, round(time.monotonic() - began, 2), error))
        print(f"    {'ok' if passed else 'FAILED'} in {results[-1].seconds:.1f} s" + (f": {error}" if error else ""),
              flush=True)
        write_results(results, ctx.out)
    return results


def _value(value: Any, limit: int = 160) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def render_md(results: Sequence[Result]) -> str:
    """The results as a Markdown table (long values shortened; ``gpu_check.json`` has them whole)."""
    lines = ["# GPU check", "", f"{sum(r.passed for r in results)} of {len(results)} checks passed.", "",
             "| # | check | passed | seconds | numbers | error |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        numbers = "; ".join(f"{k}: {_value(v)}" for k, v in r.numbers.items())
        lines.append(f"| {i} | {r.name} | {'yes' if r.passed else 'NO'} | {r.seconds:.1f} | {_cell(numbers)} "
                     f"| {_cell(r.error or '')} |")
    return "\n".join(lines) + "\n"


def write_results(results: Sequence[Result], out: Path) -> None:
    """Write ``gpu_check.json`` (one record per check) and ``gpu_check.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    records = [asdict(r) for r in results]
    (out / "gpu_check.json").write_text(json.dumps(records, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(render_md(results), encoding="utf-8")


def select(checks: Sequence[Check], only: str | None, scale: float) -> list[Check]:
    """The checks numbered in ``only`` ("2,3,4"; all when None), each command's timeout and each budget times
    ``scale``. For a rerun of checks that failed or ran out of time: a check that reads another's files (mfu,
    analyze and overhead read the demo's) needs that one listed too.

    Raises:
        ValueError: A number is not a check's, or the scale is not positive.
    """
    if not scale > 0:
        raise ValueError(f"--budget-scale must be > 0, got {scale}")
    numbers = range(1, len(checks) + 1) if only is None else [int(n) for n in only.split(",") if n.strip()]
    if bad := [n for n in numbers if not 1 <= n <= len(checks)]:
        raise ValueError(f"--only: no check numbered {bad[0]} (1-{len(checks)})")

    def scaled(check: Check) -> Check:
        plan = check.plan
        return replace(check, budget_s=check.budget_s * scale,
                       plan=lambda ctx: [replace(c, timeout_s=c.timeout_s * scale) for c in plan(ctx)])

    return [scaled(checks[n - 1]) if scale != 1 else checks[n - 1] for n in sorted(set(numbers))]


def main(argv: Sequence[str] | None = None, checks: Sequence[Check] = CHECKS, help_of: HelpOf = help_text) -> int:
    """Run the GPU check.

    Args:
        argv: Command-line arguments (``sys.argv[1:]`` when None).
        checks: The checks (tests pass their own).
        help_of: The help text of a tool, for the dry run (tests pass a fake).

    Returns:
        0 when every check passed (or the dry run found nothing wrong), 1 when one failed, 2 without CUDA.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json, gpu_check.md, logs")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and check its commands and flags")
    parser.add_argument("--only", metavar="N,M", help="run only these checks (numbers of the plan; a check that "
                        "reads the demo's files needs check 2 listed too)")
    parser.add_argument("--budget-scale", type=float, default=1.0, metavar="X",
                        help="multiply every budget, every command's timeout and the 480 s limit by X (default 1; "
                        "for a rerun of a check that ran out of time)")
    args = parser.parse_args(argv)
    try:
        checks = select(checks, args.only, args.budget_scale)
    except ValueError as err:
        parser.error(str(err))
    ctx, limit_s = Ctx(args.out.resolve()), TOTAL_LIMIT_S * args.budget_scale
    if args.dry_run:
        return dry_run(checks, ctx, help_of, limit_s)
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False); "
              "run it on a machine with one CUDA GPU, or pass --dry-run", file=sys.stderr)
        return 2
    for name in OWN_PATHS:
        path = ctx.out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    results = run_checks(checks, ctx, limit_s)
    failed = [r.name for r in results if not r.passed]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} passed; {ctx.out / 'gpu_check.md'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
