#!/usr/bin/env python
"""Masked-LM training of ModernBERT with the Hugging Face Trainer, profiled by hf_distprof: the demo's entry point.

The code is :mod:`hf_distprof.recipe.train_mlm` (inside the package, so that ``hf-distprof scaling`` finds its
default script in a wheel install too); this file runs it, with every flag passed through:

    NPROC=2 ./local_scripts/train_lambda.sh --enable-profiling --enable-memory-logging --max-steps 50
    torchrun --nproc_per_node 2 python_scripts/train_modernBERT.py --enable-profiling --max-steps 20
    python -m hf_distprof.recipe.train_mlm --help        # the same, without this file
"""

from hf_distprof.recipe.train_mlm import run

if __name__ == "__main__":
    run()
