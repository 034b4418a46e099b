"""The folder ``hf-distprof run`` puts first on ``PYTHONPATH``: it holds only :mod:`sitecustomize`."""
