import pytest


def test_a_group_the_script_leaves_is_destroyed_at_exit_once_registered(tmp_path):
    # A process that builds a gloo group of 1, registers the exit hook twice, and returns without destroying it:
    # the hook destroys it at exit (then the interpreter's own teardown finds none).
    script = tmp_path / "leave.py"
    script.write_text(
        "import atexit, os\n"
        "import torch.distributed as d\n"
        "from hf_distprof import dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "d.init_process_group('gloo', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('initialized after ours:', d.is_initialized(), flush=True))\n"
        "dist.destroy_group_at_exit(); dist.destroy_group_at_exit()\n"
        "dist.training_ended()\n"
        "atexit.register(lambda: print('initialized before ours:', d.is_initialized(), flush=True))\n"
        "from hf_distprof import dist as again\n"
        "print('registered once:', again._EXIT_DESTROY_REGISTERED, flush=True)\n")
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PORT": str(port)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Handlers run last registered first: the one registered after ours still finds the group, ours destroys it, the
    # one registered before ours finds none.
    assert "registered once: True" in proc.stdout
    assert proc.stdout.index("initialized before ours: True") < proc.stdout.index("initialized after ours: False")


def test_after_an_exception_the_group_is_left_alone_at_exit(tmp_path):
    # Training that did not end cleanly may have a gather in flight: destroying the group would wait for it.
    import os
    import socket
    import subprocess
    import sys

    script = tmp_path / "raise.py"
    script.write_text(
        "import atexit, os\n"
        "import torch.distributed as d\n"
        "from hf_distprof import dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "d.init_process_group('gloo', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('initialized after ours:', d.is_initialized(), flush=True))\n"
        "dist.destroy_group_at_exit(); dist.training_ended(False)\n"
        "raise RuntimeError('training failed')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PORT": str(port)})
    assert proc.returncode == 1 and "training failed" in proc.stderr
    assert "initialized after ours: True" in proc.stdout


@pytest.mark.parametrize("backend, settles", [("gloo", True), ("cpu:gloo,cuda:nccl", True), ("nccl", False)])
def test_a_gather_of_objects_on_gloo_lets_the_worker_free_its_tensors_before_returning(
        monkeypatch: pytest.MonkeyPatch, backend: str, settles: bool) -> None:
    # Our train-end gathers are a run's last collectives: a rank that went straight on to the script's end held the
    # interpreter lock while the DDP model's destruction joined the gloo worker, which waited for that lock to free the
    # gather's tensors (a hang after training, 1 run in 3 with --profile-on-anomaly and checkpoints). After the gather
    # the lock is released for a moment, on gloo only.
    import time

    from hf_distprof import dist as ours

    events: list[str] = []
    monkeypatch.setattr(ours, "is_distributed", lambda: True)
    monkeypatch.setattr(ours, "get_world_size", lambda: 2)
    monkeypatch.setattr(ours.dist, "get_backend", lambda group=None: backend)

    def gather(out: list, obj: object) -> None:  # type: ignore[type-arg]
        events.append("gather")
        out[:] = [obj, obj]

    monkeypatch.setattr(ours.dist, "all_gather_object", gather)
    monkeypatch.setattr(time, "sleep", lambda seconds: events.append(f"sleep {seconds}"))
    assert ours.all_gather_object({"a": 1}) == [{"a": 1}, {"a": 1}]
    assert events == (["gather", f"sleep {ours.GLOO_SETTLE_S}"] if settles else ["gather"])
    assert 0 < ours.GLOO_SETTLE_S <= 0.05  # a few of these per run, at train begin and end
