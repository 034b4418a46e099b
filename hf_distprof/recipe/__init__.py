"""What the training script uses: strategy (DDP/FSDP), models, debug environment."""
