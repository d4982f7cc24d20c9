"""The training run: options, set-up, the mode loops, session hooks, the run log,
checkpoints and warm starts, COCO evaluation of checkpoints, the --benchmark mode."""
