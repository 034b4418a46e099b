"""Where hf_distprof's records go once a run folder exists, in a fresh interpreter per logging set-up (logging's state
is per process): warnings on the console exactly once, every INFO of ours in rank{R}.log."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ..conftest import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import logging, sys
    style, out = sys.argv[1], sys.argv[2]
    if style == "basicconfig":
        logging.basicConfig()
    elif style == "info-console":
        logging.basicConfig(level=logging.INFO)
    elif style == "tf-error":
        import transformers
        transformers.logging.set_verbosity_error()
    elif style == "quiet-package":
        logging.getLogger("hf_distprof").setLevel(logging.WARNING)
    elif style == "notset":
        logging.basicConfig(level=logging.NOTSET)
    elif style in ("rich-like", "root-filter", "package-handler"):
        class Printer(logging.Handler):  # a console handler that is no StreamHandler (rich's, absl's)
            def emit(self, record):
                sys.stderr.write("printer: " + record.getMessage() + "\\n")
        target = logging.getLogger("hf_distprof" if style == "package-handler" else "")
        target.addHandler(Printer())
        if style == "root-filter":
            logging.getLogger().addFilter(lambda record: False)  # applies to the root's own records only
    from hf_distprof import dist, paths
    paths.resolve_run_dir(out, "r", owner=object())
    ours = dist.get_logger("hf_distprof.test")
    ours.info("an info of ours")
    ours.warning("a warning of ours")
    logging.getLogger("other.lib").info("an info of theirs")
    logging.getLogger("other.lib").warning("a warning of theirs")
""")


def run(style: str, tmp_path) -> tuple[list[str], str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, style, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if " of ours" in line or " of theirs" in line]
    return lines, (tmp_path / "r" / "rank0.log").read_text()


@pytest.mark.parametrize("style", ["none", "tf-error"])
def test_a_script_without_a_console_handler_hears_our_warnings(style, tmp_path):
    console, log = run(style, tmp_path)
    # Ours, printed by our own console handler, with the rank; theirs stays as Python leaves it (in the log only).
    (line,) = console
    assert line.endswith(" hf_distprof WARNING: [RANK 0] a warning of ours")
    assert "INFO hf_distprof.test: [RANK 0] an info of ours" in log
    assert "WARNING hf_distprof.test: [RANK 0] a warning of ours" in log
    assert "WARNING other.lib: a warning of theirs" in log and "an info of theirs" not in log


def test_basicconfig_without_a_level_prints_each_warning_once_and_keeps_our_info_in_the_log(tmp_path):
    console, log = run("basicconfig", tmp_path)
    assert console == ["WARNING:hf_distprof.test:[RANK 0] a warning of ours", "WARNING:other.lib:a warning of theirs"]
    assert log.count("an info of ours") == 1 and log.count("a warning of ours") == 1
    assert "an info of theirs" not in log  # the script's level for everyone else


def test_a_script_that_asks_for_info_on_its_console_gets_ours_there_once(tmp_path):
    console, log = run("info-console", tmp_path)
    assert console == ["INFO:hf_distprof.test:[RANK 0] an info of ours", "WARNING:hf_distprof.test:[RANK 0] a "
                       "warning of ours", "INFO:other.lib:an info of theirs", "WARNING:other.lib:a warning of theirs"]
    assert log.count("an info of ours") == 1 and log.count("an info of theirs") == 1


def test_a_level_set_on_our_package_is_respected(tmp_path):
    console, log = run("quiet-package", tmp_path)
    assert [line.rsplit(": ", 1)[1] for line in console] == ["[RANK 0] a warning of ours"]
    assert "an info of ours" not in log and "a warning of ours" in log


def test_a_console_handler_that_is_no_stream_handler_prints_our_warnings_once(tmp_path):
    console, log = run("rich-like", tmp_path)
    assert console == ["printer: [RANK 0] a warning of ours", "printer: a warning of theirs"]
    assert "an info of ours" in log


def test_a_handler_on_our_logger_gets_what_it_got_before_and_nothing_twice(tmp_path):
    console, log = run("package-handler", tmp_path)
    # Our level stays the application's (WARNING): no INFO forced on their handler, and no copy of ours.
    assert console == ["printer: [RANK 0] a warning of ours"]
    assert "a warning of ours" in log and "an info of ours" not in log


def test_a_filter_on_the_root_does_not_drop_our_records(tmp_path):
    console, log = run("root-filter", tmp_path)
    assert console == ["printer: [RANK 0] a warning of ours", "printer: a warning of theirs"]
    assert "a warning of ours" in log


def test_a_root_at_notset_lets_our_info_through_as_python_does(tmp_path):
    console, _ = run("notset", tmp_path)
    assert console[:2] == ["INFO:hf_distprof.test:[RANK 0] an info of ours",
                           "WARNING:hf_distprof.test:[RANK 0] a warning of ours"]


EARLY = textwrap.dedent("""
    import sys
    from hf_distprof import dist, logs, paths
    logs.route_package_logs()  # as build_callbacks does: the Trainer and its callbacks come before the run folder
    ours = dist.get_logger("hf_distprof.test")
    ours.info("an early info of ours")
    ours.warning("an early warning of ours")
    logs.record_in_rank_log("hf_distprof.test", 20, "a line the console had another way")
    paths.resolve_run_dir(sys.argv[1], "r", owner=object())
    ours.info("an info of ours")
""")


def test_our_records_from_before_the_run_folder_open_its_rank_log(tmp_path):
    proc = subprocess.run([sys.executable, "-c", EARLY, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # The console as before: the warning printed once (Python's last resort: no handler anywhere yet), no INFO.
    assert [line for line in proc.stderr.splitlines() if "of ours" in line or "another way" in line] == [
        "[RANK 0] an early warning of ours"]
    log = (tmp_path / "r" / "rank0.log").read_text().splitlines()
    assert [line.split(" hf_distprof.test: ", 1)[1] for line in log if "hf_distprof.test" in line] == [
        "[RANK 0] an early info of ours", "[RANK 0] an early warning of ours", "a line the console had another way",
        "[RANK 0] an info of ours"]
    assert " rank 0 " in log[0] and " INFO " in log[0] and " WARNING " in log[1]
