"""Our callbacks run before the trackers' so that what we add to a logging step's ``logs`` reaches them.

The Trainer calls its callbacks in list order: its ``DefaultFlowCallback``, then one per tracker ``report_to`` names
(TensorBoard, W&B, MLflow, Trackio, ...), then the ``callbacks=`` a script passes (ours), then the progress printer.
The trackers' ``on_log`` has sent a logging step's ``logs`` before ours adds the step timer's figures to them: the
console showed ``timing/step_s``, the W&B and MLflow runs did not. And a tracker's ``on_train_end`` (MLflow's ends its
run) came before ours could send the end-of-run answer. So once the Trainer is built, our callbacks are moved right
after ``DefaultFlowCallback`` (which decides ``should_log``, read by ours), in their own order, the others' order
unchanged. The callback list is found without access to the Trainer: it is the list that holds our callback, held by
an object that has ``callbacks`` and ``call_event`` (the ``CallbackHandler``). It is replaced, never changed in place:
the Trainer may be iterating the old one when this runs.
"""

from __future__ import annotations

import gc
from typing import Any

from hf_distprof import dist

logger = dist.get_logger(__name__)


def is_ours(callback: Any) -> bool:
    """Whether ``callback`` is one of hf_distprof's."""
    return type(callback).__module__.startswith("hf_distprof.")


def handler_of(callback: Any) -> Any:
    """The Trainer's ``CallbackHandler`` whose list holds ``callback``, or None."""
    for holder in gc.get_referrers(callback):
        if type(holder) is not list:
            continue
        for owner in gc.get_referrers(holder):
            if type(owner) is dict:  # the handler's __dict__
                for handler in gc.get_referrers(owner):
                    if getattr(handler, "callbacks", None) is holder and callable(getattr(handler, "call_event", None)):
                        return handler
            elif getattr(owner, "callbacks", None) is holder and callable(getattr(owner, "call_event", None)):
                return owner
    return None


def first_after_flow(callbacks: list[Any]) -> list[Any]:
    """``callbacks`` with ours moved right after the leading ``DefaultFlowCallback`` (or first, without one)."""
    ours = [cb for cb in callbacks if is_ours(cb)]
    others = [cb for cb in callbacks if not is_ours(cb)]
    at = 1 if others and type(others[0]).__name__ == "DefaultFlowCallback" else 0
    return others[:at] + ours + others[at:]


def put_ours_first(callback: Any) -> bool:
    """Reorder the callback list that holds ``callback`` (see the module docstring); True when it was found (it may
    already have been in order)."""
    try:
        handler = handler_of(callback)
    except Exception:  # noqa: BLE001 - an odd object among the referrers: leave the order as it is
        handler = None
    if handler is None:
        logger.info("could not find the Trainer's callback list: trackers may not see hf_distprof's live figures")
        return False
    ordered = first_after_flow(handler.callbacks)
    if ordered != handler.callbacks:
        handler.callbacks = ordered
    return True
