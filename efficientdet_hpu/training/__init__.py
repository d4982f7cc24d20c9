"""The training run: the Estimator model_fn (det_model_fn), set-up, the mode loops, session
hooks, the run log, checkpoints and warm starts, float16 loss scaling, data faults met while
reading, COCO evaluation of checkpoints (evaluation, coco_metric) and the --benchmark mode."""
