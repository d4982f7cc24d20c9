"""The model and its step: the Estimator model_fn (det_model_fn), micro-batches of a step
(accumulation), float16 loss scaling (loss_scale) and frozen variables (var_freeze). What runs
it (set-up, loops, hooks, evaluation of checkpoints) is engine/."""
