"""Run by Python at start-up in every process ``hf-distprof run`` starts (this folder is first on ``PYTHONPATH``).

It costs an environment lookup and one import hook: nothing of torch or transformers is imported here. Then the
``sitecustomize`` this one hides (a later folder on ``sys.path``, e.g. a distribution's) runs as it would have.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _attach() -> None:
    if not os.environ.get("HF_DISTPROF_RUN_ARGS"):
        return
    try:
        if importlib.util.find_spec("hf_distprof") is None and os.environ.get("HF_DISTPROF_PACKAGE_ROOT"):
            # This interpreter does not have hf_distprof (hf-distprof run came from another environment): last on
            # the path, so it shadows nothing of the script's own.
            sys.path.append(os.environ["HF_DISTPROF_PACKAGE_ROOT"])
        from hf_distprof.autorun import install

        install()
    except Exception as err:  # noqa: BLE001 - start-up must never fail because of us
        sys.stderr.write(f"hf_distprof: hf-distprof run could not attach its callbacks: {err!r}\n")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_attach()
_chain()
