"""One TrainerCallback per module. ``hf_distprof.config.build_callbacks`` constructs only the enabled ones."""
