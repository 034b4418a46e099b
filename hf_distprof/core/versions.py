"""Python's and the libraries' versions, as the run manifest records them and ``hf-distprof doctor`` compares
them across ranks (torch is imported when asked, so importing this module costs nothing)."""

from __future__ import annotations

import importlib.metadata
import platform

from hf_distprof._version import __version__

# Libraries whose version is read from their installed metadata (None when one is not installed).
PACKAGES = ("transformers", "accelerate")


def library_versions(device: bool = False, own: bool = True) -> dict[str, str | None]:
    """Python's, torch's and the libraries' versions, in that order (None for what is not there).

    Args:
        device: Also ``cuda`` (the CUDA torch was built with) and ``nccl`` (the NCCL it loads, read only when
            CUDA and NCCL are available), after torch.
        own: Also ``hf_distprof``, last.

    Returns:
        Name -> version.
    """
    import torch

    out: dict[str, str | None] = {"python": platform.python_version(), "torch": str(torch.__version__)}
    if device:
        import torch.distributed as dist

        out["cuda"] = torch.version.cuda or None
        nccl_there = dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if nccl_there else None
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    if own:
        out["hf_distprof"] = __version__
    return out
