"""Early stopping on the validation AP (engine/early_stop.py): the decision worked by hand on
evaluation files, and a real train_and_eval run that stops before its last epoch."""
import json

import pytest

from cli_runs import TINY_HPARAMS, run_main, tiny_flags
from efficientdet_hpu.engine import early_stop
from efficientdet_hpu.engine import train_log


def _write_evaluations(model_dir, aps):
    (model_dir / 'eval').mkdir(parents=True)
    for step, ap in aps.items():
        (model_dir / 'eval' / ('metrics-%d.json' % step)).write_text(
            json.dumps({'step': step, 'metrics': {'AP': ap, 'AP50': None}}))
    (model_dir / 'eval' / 'metrics_latest.json').write_text('{}')


def test_patience_counts_the_evaluations_after_the_first_best(tmp_path):
    # Best 0.30 first reached at step 200 (step 500 only ties it): three evaluations after it.
    _write_evaluations(tmp_path, {100: 0.10, 200: 0.30, 300: 0.25, 400: 0.29, 500: 0.30})
    history = early_stop.ap_history(str(tmp_path))
    assert history == [(100, 0.1), (200, 0.3), (300, 0.25), (400, 0.29), (500, 0.3)]
    assert early_stop.stop_decision(history, 4) is None
    assert early_stop.stop_decision(history, 0) is None  # 0: never.
    decision = early_stop.stop_decision(history, 3)
    line = early_stop.stop_line(decision, 3, 'run')
    assert line == ('early stop at step 500: AP 0.3000 of step 200 not beaten in the 3 '
                    'evaluations after it (--early_stop_patience=3); best checkpoint in run/best')
    assert decision[0] == 500
    # A new best resets the count; no evaluations, no stop.
    assert early_stop.stop_decision(history + [(600, 0.31)], 1) is None
    assert early_stop.stop_decision([], 1) is None


def test_an_early_stop_is_the_final_step_of_the_training(tmp_path):
    # --mode=eval beside the run stops at the training's final step: an early stop is one,
    # and training that continues afterwards (a rerun with more patience) replaces it.
    train_log.append_json_log(str(tmp_path), {'event': 'train', 'step': 100, 'total_steps': 900})
    assert train_log.training_final_step(str(tmp_path)) == 900
    train_log.append_json_log(str(tmp_path), {'event': 'early_stop', 'step': 400})
    assert train_log.training_final_step(str(tmp_path)) == 400
    train_log.append_json_log(str(tmp_path), {'event': 'train', 'step': 500, 'total_steps': 900})
    assert train_log.training_final_step(str(tmp_path)) == 900


@pytest.mark.slow
def test_train_and_eval_stops_early_and_a_rerun_trains_nothing(tiny_dataset, tmp_path):
    # 4 epochs of 2 steps that change nothing the evaluation reads (learning rate 0, batch
    # norm statistics frozen by momentum 1): the second evaluation repeats the first's AP
    # and does not beat it, so patience 1 stops at step 4, not at step 8.
    flags = tiny_flags(tiny_dataset, tmp_path / 'run', '--mode=train_and_eval',
                       '--num_epochs=4', '--early_stop_patience=1', '--cp_every_n_steps=2',
                       hparams=TINY_HPARAMS + ',learning_rate=0,lr_warmup_init=0,'
                       'batch_norm_momentum=1.0')
    result = run_main(flags)
    assert result.returncode == 0, result.stdout[-5000:]
    stops = [l for l in result.stdout.splitlines() if l.startswith('early stop at step')]
    assert stops == ['early stop at step 4: AP %s of step 2 not beaten in the 1 evaluations '
                     'after it (--early_stop_patience=1); best checkpoint in %s/best'
                     % (stops[0].split('AP ')[1].split(' ')[0], tmp_path / 'run')], stops
    assert sorted(p.name for p in (tmp_path / 'run' / 'eval').glob('metrics-*.json')) == [
        'metrics-2.json', 'metrics-4.json']
    assert train_log.training_final_step(str(tmp_path / 'run')) == 4
    again = run_main(flags)
    assert again.returncode == 0, again.stdout[-5000:]
    assert stops[0] in again.stdout
    assert 'step 5/' not in again.stdout and 'evaluating' not in again.stdout
    assert not (tmp_path / 'run' / 'eval' / 'metrics-6.json').exists()
