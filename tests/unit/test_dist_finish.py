"""``hf_distprof.dist.finish``: the last line of a training script. It destroys the process group, runs the atexit
handlers, flushes what was printed, and leaves with the given status without the interpreter's C++ teardown."""

from __future__ import annotations

import ast

import subprocess
import sys
import textwrap
from pathlib import Path

from hf_distprof.dist import finish


def run(code: str, tmp_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_a_finished_one_rank_gloo_run_leaves_with_its_status_after_the_atexit_handlers(tmp_path):
    proc = run(f"""
        import atexit, logging, sys
        import torch.distributed as dist
        from hf_distprof.dist import finish
        logging.basicConfig(filename="log.txt", level=logging.INFO)
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        atexit.register(lambda: print("atexit handler ran, group initialized:", dist.is_initialized()))
        logging.info("last line of the log")
        sys.stdout.write("unflushed ")
        finish(3)
        print("never printed")
    """, tmp_path)
    assert proc.returncode == 3, proc.stderr
    # The group was destroyed before the handlers ran; what was buffered is out; the log file got its line.
    assert proc.stdout == "unflushed atexit handler ran, group initialized: False\n"
    assert (tmp_path / "log.txt").read_text() == "INFO:root:last line of the log\n"


def test_without_a_process_group_it_only_flushes_and_exits(monkeypatch):
    exits: list[int] = []
    ran: list[str] = []
    monkeypatch.setattr("hf_distprof.dist.atexit._run_exitfuncs", lambda: ran.append("atexit"))
    finish(0, exit_process=exits.append)
    assert (exits, ran) == ([0], ["atexit"])


def test_the_training_script_ends_through_finish():
    # Its run()'s last statement, which both ways of starting it call: a finished run is not turned into a failed
    # job by the C++ teardown.
    root = Path(__file__).resolve().parents[2]
    module = ast.parse((root / "hf_distprof" / "recipe" / "train_mlm.py").read_text())
    run = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert ast.unparse(run.body[-1]) == "finish(0)"
    for source in (module, ast.parse((root / "python_scripts" / "train_modernBERT.py").read_text())):
        main_block = next(n for n in source.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
        assert [ast.unparse(s) for s in main_block.body] == ["run()"]
