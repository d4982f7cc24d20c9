"""Checkpoints, below both the training engine and serving: finding them and restoring the EMA
weights (checkpoints), damaged ones (checkpoint_integrity), warm starts (warm_start)."""
