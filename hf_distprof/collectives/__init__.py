"""The collective bandwidth benchmark (`hf-distprof bench-collectives`)."""
