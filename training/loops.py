"""The modes of a run: train, eval (continuous, beside a training job) and train_and_eval
(an evaluation after each epoch), over a prepared Run (training/run_setup.py)."""
import hparams_config
from dataset import label_map as label_map_lib
from runtime import distributed
from training import benchmark
from training import checkpoints
from training import evaluation
from training import hooks
from training import run_setup
from training.run_setup import train_input_fn

# Errors that are the user's to fix (flags, data, model_dir, a diverging recipe): main.py
# prints their one-line message and exits 2, without a traceback.
USER_ERRORS = (hparams_config.ConfigError, run_setup.RunSetupError, checkpoints.CheckpointError,
               distributed.DeviceError, hooks.NonFiniteLossError, label_map_lib.LabelMapError)


def current_step(run):
    """Rank 0's checkpointed step, shared so every rank makes the same decisions."""
    step = 0
    if distributed.is_main():
        latest = checkpoints.latest_checkpoint(run.options.model_dir)
        step = checkpoints.checkpoint_step(latest) if latest else 0
    return distributed.broadcast_object(step)


def train_until(run, max_steps):
    if current_step(run) >= max_steps:
        return
    run.estimator.train(train_input_fn(run), max_steps=max_steps,
                        hooks=hooks.make_training_hooks(run.options, run.total_steps, max_steps))


def execute(run):
    """Runs the mode; returns the process exit status."""
    options = run.options
    if options.benchmark:
        return benchmark.run_benchmark(run)
    if options.mode == 'eval':
        evaluation.evaluate_continuously(run)
        return 0
    if options.mode == 'train':
        train_until(run, run.total_steps)
        if options.eval_after_training:
            evaluation.evaluate_latest(run)
        return 0
    epochs = run.total_steps // run.steps_per_epoch
    for epoch in range(1, epochs + 1):
        step = min(epoch * run.steps_per_epoch, run.total_steps)
        if current_step(run) >= step and epoch < epochs:
            continue
        train_until(run, step)
        evaluation.evaluate_latest(run)
    return 0
