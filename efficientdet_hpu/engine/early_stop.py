"""Early stopping on the validation AP (`--early_stop_patience=N`, train_and_eval).

After each evaluation the run looks at the evaluations model_dir holds (eval/metrics-<step>.json,
one per evaluated checkpoint): when the best AP (the first step that reached it, the one
model_dir/best keeps) has not been beaten by the N evaluations after it, training stops there
with one line, and the JSON log records the stop step, so that `--mode=eval` beside the run
stops at it too and rerunning the same command says so again instead of training on. A rerun
with a larger patience (or 0, never) continues the schedule from the last checkpoint.
"""
import glob
import json
import os
import re

from absl import logging

from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.engine import checkpoint_eval
from efficientdet_hpu.engine import train_log

_METRICS_FILE = re.compile(r'metrics-(\d+)\.json$')


def ap_history(model_dir):
    """[(step, AP)] of model_dir's evaluations, by step; files without a finite AP are left
    out (a test-dev run writes none)."""
    history = []
    for path in glob.glob(os.path.join(model_dir, 'eval', 'metrics-*.json')):
        match = _METRICS_FILE.search(os.path.basename(path))
        if not match:
            continue
        try:
            with open(path) as f:
                ap = json.load(f)['metrics'].get('AP')
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if ap is not None:
            history.append((int(match.group(1)), float(ap)))
    return sorted(history)


def stop_decision(history, patience):
    """(stop step, best step, best AP, evaluations after the best) when the best AP of
    `history` has gone `patience` evaluations unbeaten, else None (patience 0: never)."""
    if not patience or not history:
        return None
    best_step, best_ap = max(history, key=lambda item: (item[1], -item[0]))
    unbeaten = [step for step, _ in history if step > best_step]
    if len(unbeaten) < patience:
        return None
    return unbeaten[-1], best_step, best_ap, len(unbeaten)


def stop_line(decision, patience, model_dir):
    """The one line that ends training, for a stop_decision."""
    step, best_step, best_ap, count = decision
    return ('early stop at step %d: AP %.4f of step %d not beaten in the %d evaluations after '
            'it (--early_stop_patience=%d); best checkpoint in %s'
            % (step, best_ap, best_step, count, patience,
               os.path.join(model_dir, checkpoint_eval.BEST_DIR)))


def reached(run):
    """True (on every rank) when the run should stop training now; rank 0 says why once and
    records the stop in the JSON log."""
    options = run.options
    decision = None
    if distributed.is_main() and options.early_stop_patience:
        decision = stop_decision(ap_history(options.model_dir), options.early_stop_patience)
        if decision:
            print(stop_line(decision, options.early_stop_patience, options.model_dir),
                  flush=True)
            if train_log.training_final_step(options.model_dir) != decision[0]:
                train_log.append_json_log(options.model_dir, {
                    'event': 'early_stop', 'step': decision[0],
                    'patience': options.early_stop_patience})
    return bool(distributed.broadcast_object(decision is not None))


def warn_if_unused(options):
    """One line when the patience is set in a mode without evaluations between epochs."""
    if options.early_stop_patience and options.mode != 'train_and_eval':
        logging.warning('--early_stop_patience=%d has no effect in --mode=%s: it counts the '
                        'evaluations of --mode=train_and_eval', options.early_stop_patience,
                        options.mode)
