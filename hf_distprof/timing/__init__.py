"""Step timing: clocks, the per-step phase recorder, the cross-rank report and the comm-overhead probe.

Layers, bottom up:

* ``clock``: where a timestamp comes from (``time.perf_counter`` on CPU, CUDA events on GPU);
* ``recorder``: turns Trainer/model hook calls into one ``StepTiming`` per optimizer step;
* ``instrument``: the model/gradient hooks and the timed data loader that feed the recorder;
* ``report``: pure functions over per-rank numbers (imbalance, slowest rank, warnings, table, JSON);
* ``publish``: TensorBoard scalars and the figures added to the Trainer's logs;
* ``comm_overhead``: the ``no_sync`` A/B measurement run once before training;
* ``gpu_health``: a rank's GPU as NVML sees it (clocks, throttle reasons), sampled on logging steps.

Nothing here imports transformers; ``hf_distprof.callbacks.step_timer`` wires it to the Trainer.
"""
