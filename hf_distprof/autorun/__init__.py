"""``hf-distprof run``'s attachment: every ``transformers.Trainer`` built in the process gets our callbacks.

``hf-distprof run [flags] -- COMMAND`` puts :mod:`hf_distprof.autorun.pythonpath` first on ``PYTHONPATH`` and the
flags, as JSON, in :data:`RUN_ARGS_ENV`; both pass through ``torchrun``, ``accelerate launch`` and ``srun`` to
every worker. There Python runs our ``sitecustomize``, which calls :func:`install`: an import hook that, when
``transformers.trainer`` is imported, wraps ``Trainer.__init__`` so that each new Trainer (subclasses included)
gets the callbacks :func:`hf_distprof.callbacks.build_callbacks` builds for those flags, unless the script
already passes callbacks of ours (then it gets none: no duplicates). The script's own parser never sees our
flags. Nothing here imports torch or transformers until the script does.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# The profiling flags (ProfilingArguments' fields, JSON) for every process of the command.
RUN_ARGS_ENV = "HF_DISTPROF_RUN_ARGS"
# Where hf_distprof itself lies, appended to sys.path by the hook only when the worker cannot import it otherwise.
PACKAGE_ROOT_ENV = "HF_DISTPROF_PACKAGE_ROOT"
TRAINER_MODULE = "transformers.trainer"
_ATTACHED = "_hf_distprof_attached"
_AUTO = "_hf_distprof_auto_callbacks"  # on a Trainer: the callbacks hf-distprof run added


def _say(rank: int, message: str, *, console: bool = True, level: int = logging.INFO) -> None:
    """``message`` on stderr when ``console`` (where the launcher shows it, whatever logging the script set up: we
    are inside its Trainer's constructor), and into this rank's ``rank{R}.log`` in any case: the file opens at train
    start, with this record at its top (:func:`hf_distprof.logs.record_in_rank_log`)."""
    text = f"[RANK {rank}] {message}"
    if console:
        sys.stderr.write(f"hf_distprof: {text}\n")
        sys.stderr.flush()
    try:
        from hf_distprof import logs

        logs.record_in_rank_log(__name__, level, text)
    except Exception:  # noqa: BLE001 - the line was said; a log of ours never breaks training
        pass


def _library_dirs() -> tuple[str, ...]:
    """Folders whose frames are never "where the script built it": transformers, installed packages, this one."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    transformers = sys.modules.get("transformers")
    if transformers is not None and getattr(transformers, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(transformers.__file__)))
    return tuple(dirs)


def _created_at() -> str:
    """Where the script built the Trainer: the innermost frame outside transformers, installed packages (TRL's
    trainers) and this module; the outermost frame when every one is."""
    frames = traceback.extract_stack()[:-2]
    skip = _library_dirs()
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith(skip) and "-packages" + os.sep not in path and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}"
    return f"{frames[0].filename}:{frames[0].lineno}" if frames else "?"


def attach(trainer: Any) -> list[Any]:
    """Give ``trainer`` the callbacks for the flags in :data:`RUN_ARGS_ENV` (once per Trainer).

    Returns:
        The callbacks added; none when the script passes hf_distprof callbacks itself.
    """
    if getattr(trainer, _ATTACHED, False):
        return []
    setattr(trainer, _ATTACHED, True)
    from hf_distprof.callbacks import build_callbacks
    from hf_distprof.config import ProfilingArguments

    rank = _rank(trainer)
    where = f"{type(trainer).__name__} built at {_created_at()}"
    ours = [type(cb).__name__ for cb in trainer.callback_handler.callbacks if _ours(cb)]
    if ours:
        _say(rank, f"hf-distprof run: {where} already has {', '.join(ours)}; it gets no callbacks from "
                   f"hf-distprof run (no duplicates), so the flags given to hf-distprof run do not apply to it: pass "
                   "them to the script, whose callbacks follow its own flags", console=rank == 0)
        return []
    callbacks = build_callbacks(ProfilingArguments(**json.loads(os.environ[RUN_ARGS_ENV])))
    for callback in callbacks:
        trainer.add_callback(callback)
    setattr(trainer, _AUTO, callbacks)
    # Every rank's log says what was attached; the console hears it once, from rank 0.
    _say(rank, f"hf-distprof run: attached {', '.join(type(cb).__name__ for cb in callbacks)} to {where}",
         console=rank == 0)
    return callbacks


def _rank(trainer: Any) -> int:
    """The Trainer's rank, else the launcher's (``RANK``): ranks that each train alone (``accelerate launch
    --multi_gpu`` on a machine without GPUs) each call themselves process 0 (a trial: both said "[RANK 0]")."""
    index = int(getattr(trainer.args, "process_index", 0))
    try:
        return index or int(os.environ.get("RANK", "0"))
    except ValueError:
        return index


def _ours(callback: Any) -> bool:
    cls = callback if isinstance(callback, type) else type(callback)
    return cls.__module__.startswith("hf_distprof.")


def withdraw(trainer: Any, added: Any) -> None:
    """The script added a callback of ours after the Trainer was built: take back the ones hf-distprof run added."""
    auto = getattr(trainer, _AUTO, None)
    if not auto or not _ours(added) or any(added is cb for cb in auto):
        return
    setattr(trainer, _AUTO, [])
    for callback in auto:
        trainer.remove_callback(callback)
    rank = _rank(trainer)
    name = added.__name__ if isinstance(added, type) else type(added).__name__
    _say(rank, f"hf-distprof run: the script added {name} itself; the callbacks hf-distprof run attached are "
               f"taken back (no duplicates)", console=rank == 0)


def patch_trainer(module: ModuleType) -> None:
    """Wrap ``module.Trainer.__init__`` so that every Trainer built from now on is attached, and ``add_callback`` so
    that a callback of ours the script adds later replaces the attached ones."""
    trainer_cls = module.Trainer
    original = trainer_cls.__init__
    if getattr(original, _ATTACHED, False):
        return
    original_add = trainer_cls.add_callback

    @functools.wraps(original_add)
    def add_callback(self: Any, callback: Any) -> None:
        original_add(self, callback)
        try:
            withdraw(self, callback)
        except Exception as err:  # noqa: BLE001 - profiling never breaks training
            _say(int(getattr(getattr(self, "args", None), "process_index", 0)),
                 f"hf-distprof run: could not take back the attached callbacks: {err!r}", level=logging.WARNING)

    trainer_cls.add_callback = add_callback

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method it replaces
        original(self, *args, **kwargs)
        try:
            attach(self)
        except Exception as err:  # noqa: BLE001 - profiling never breaks training
            _say(int(getattr(getattr(self, "args", None), "process_index", 0)),
                 f"hf-distprof run: could not attach the callbacks: {err!r}; training goes on without them",
                 level=logging.WARNING)

    setattr(__init__, _ATTACHED, True)
    trainer_cls.__init__ = __init__


class _PatchingLoader(importlib.abc.Loader):
    """Runs ``transformers.trainer`` as usual, then patches its Trainer."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        patch_trainer(module)


class _TrainerFinder(importlib.abc.MetaPathFinder):
    """Finds ``transformers.trainer`` with the other finders and hands back a spec whose loader patches it."""

    def __init__(self) -> None:
        self._busy = threading.local()  # another finder that asks every finder (as this one does) asks us back

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != TRAINER_MODULE or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None:
                        spec.loader = _PatchingLoader(spec.loader)
                    return spec
        except Exception:  # noqa: BLE001 - never in the way of the script's import: the usual finders take over
            return None
        finally:
            self._busy.on = False
        return None


def install() -> None:
    """Patch the Trainer now if transformers.trainer is imported already, else when it is."""
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        patch_trainer(module)
        return
    if not any(isinstance(f, _TrainerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TrainerFinder())


def command_environment(prof: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``hf-distprof run``'s COMMAND runs in: our start-up hook first on ``PYTHONPATH``, the flags
    (``prof``, its :class:`~hf_distprof.config.ProfilingArguments`) as JSON."""
    env = dict(os.environ if environ is None else environ)
    hook_dir = str(Path(__file__).resolve().parent / "pythonpath")
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook_dir]
    # Only the hook goes first: the user's own entries keep their order ahead of site-packages. Where the workers'
    # interpreter cannot import hf_distprof (another venv, a source checkout), the hook appends this root last.
    env["PYTHONPATH"] = os.pathsep.join([hook_dir, *kept])
    env[PACKAGE_ROOT_ENV] = str(Path(__file__).resolve().parent.parent.parent)
    env[RUN_ARGS_ENV] = json.dumps({f.name: getattr(prof, f.name) for f in dataclasses.fields(prof)})
    return env
