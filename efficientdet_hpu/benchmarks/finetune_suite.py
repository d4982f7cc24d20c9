"""`bench.py finetune_suite`: the one command (`finetune.py ... --max_minutes=B`, from Lite0's
ImageNet weights as its docs say) against the project's best hand recipe for each set of
benchmarks/finetune_sets.py, both given the set's budget B; per set both AP50s on the whole
validation photos, both wall times and the budget.

The hand recipe is a YAML of configs/ run as its docs run it: configs/demo.yaml (D0 at 128 px
from random weights, whole photos) or configs/trees-lite0.yaml (Lite0 at 320 px from the
ImageNet backbone, on 320 px tiles with overlap 64 as make trees), the converter before it and
`inference.py predict --annotations_file` (tiled likewise) on the validation photos with its
best checkpoint after it. Its schedule (epochs, warm-up share, evaluations) is stretched or
shrunk to the budget: a `main.py --benchmark` of RATE_STEPS steps first (not counted) measures
its rate, and num_examples_per_epoch is set so that the training fits what the converter, the
start-up and the prediction leave; where it trains slower than measured, it is stopped at the
budget (SIGTERM: main.py checkpoints) and its latest checkpoint predicted, the table saying so.
Runs are kept under --work_dir (default runs/finetune-suite): rerunning the command reuses
finished sides.
"""
import json
import os
import signal
import subprocess
import sys
import time

from efficientdet_hpu.benchmarks import finetune_sets
from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import processes
from efficientdet_hpu.core import run_end

RECIPES = {'demo': ('configs/demo.yaml', 2, False), 'trees': ('configs/trees-lite0.yaml', 20, True)}
TILES = ['--tile_size=320', '--tile_overlap=64']
BATCH = 8
# The hand recipe's rate, over steps enough that a passing slow or fast spell of a shared
# machine moves it less (a few steps can set a schedule well over the budget).
RATE_STEPS = 30
PREDICT_SECONDS = 60.0  # inference.py predict's start-up and graph (the hand side's estimate).
STOPPED_STATUS = 128 + signal.SIGTERM  # main.py stopped by SIGTERM, its checkpoint written.
COLUMNS = (('set', 'set', '%s'), ('budget min', 'budget_minutes', '%.0f'),
           ('one command AP50', 'finetune_AP50', '%.3f'), ('min', 'finetune_minutes', '%.1f'),
           ('hand recipe', 'hand', '%s'), ('hand AP50', 'hand_AP50', '%.3f'),
           ('min ', 'hand_minutes', '%.1f'), ('hand steps', 'hand_steps', '%d'),
           ('plan', 'plan', '%s'))


def _run(command, timeout, log, what, stop_after=None):
    """Runs command from the repository root, its output written to `log` as it comes (and
    kept); returns (seconds, output). stop_after: seconds after which it is sent SIGTERM (a
    training run checkpoints and exits: main.py's exit status then counts as success)."""
    print('$ ' + ' '.join(command), flush=True)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    lines = []
    start = time.monotonic()
    with open(log, 'a') as stream:
        stream.write('$ %s\n' % ' '.join(command))

        def on_line(line):
            lines.append(line)
            stream.write(line + '\n')
            stream.flush()
        try:
            status, stopped = processes.run_streaming(command, timeout, on_line,
                                                      cwd=report.REPO, stop_after=stop_after)
        except subprocess.TimeoutExpired:
            raise BenchError('%s did not end within %.0f min and was stopped; its output: %s'
                             % (what, timeout / 60.0, log)) from None
    if status != 0 and not (stopped and status == STOPPED_STATUS):
        raise BenchError('%s failed (exit %d); its output: %s' % (what, status, log))
    return time.monotonic() - start, '\n'.join(lines)


def one_command(data_set, built, pth, directory):
    """The fine-tune of the set in its budget: {'AP50', 'minutes', 'plan'}."""
    out = os.path.join(directory, 'finetune')
    summary = os.path.join(out, 'summary.json')
    if not os.path.exists(summary):
        flags = ['--data=%s' % built['data'], '--output_dir=%s' % out, '--weights=%s' % pth,
                 '--max_minutes=%g' % data_set.budget_minutes]
        if built.get('val_data'):
            flags.append('--val_data=%s' % built['val_data'])
        if built.get('val_photos'):
            flags.append('--val_photos=%s' % ','.join(built['val_photos']))
        if built.get('single_class'):
            flags.append('--single_class=%s' % built['single_class'])
        _run([sys.executable, 'finetune.py'] + flags, data_set.budget_minutes * 120 + 1800,
             os.path.join(directory, 'finetune.log'), 'finetune.py on %s' % data_set.name)
    with open(summary) as stream:
        result = json.load(stream)
    with open(os.path.join(out, 'plan.json')) as stream:
        record = json.load(stream)
    reasons = dict(tuple(item) for item in record['reasons'])
    plan = '%s at %d px%s%s; %s' % (result['model'].replace('efficientdet-', ''),
                                    result['image_size'],
                                    ', tiles' if result['tile_size'] else '',
                                    '' if record['weights']['kind'] else ', random weights',
                                    reasons.get('search', 'no search'))
    if result.get('tta'):  # The evaluation kept the flips: what the photos as they are gave.
        plan += '; flips fused (AP50 %.3f as they are)' % result['views']['as they are']['AP50']
    return {'AP50': result['AP50'], 'minutes': result['minutes'], 'plan': plan,
            'steps': result['steps_trained'], 'ended': result['training_ended']}


def _convert(built, records, tiled, log):
    seconds = 0.0
    for split in ('train', 'val'):
        if os.path.exists(os.path.join(records, split + '-summary.json')):
            continue
        spent, _ = _run([sys.executable, '-m', 'dataset.create_coco_tfrecord',
                         '--image_dir=%s' % built[split + '_image_dir'],
                         '--object_annotations_file=%s' % built[split + '_json'],
                         '--output_file_prefix=%s' % os.path.join(records, split),
                         '--num_shards=2'] + (TILES if tiled else []), 7200, log, 'the converter')
        seconds += spent
    with open(os.path.join(records, 'val-summary.json')) as stream:
        val_images = json.load(stream)['images_written']
    return seconds, val_images


def _rate(recipe, records, pth, directory, log):
    """(training images/s, start-up s) of the recipe on the records: a short --benchmark."""
    _, output = _run([sys.executable, 'main.py', '--mode=train', '--benchmark',
                      '--hparams=%s' % recipe, '--model_dir=%s' % os.path.join(directory, 'rate'),
                      '--benchmark_steps=%d' % RATE_STEPS, '--benchmark_warmup_steps=5',
                      '--training_file_pattern=%s' % os.path.join(records, 'train-*.tfrecord')]
                     + (['--backbone_ckpt=%s' % pth] if pth else []), 3600, log,
                     'the hand recipe\'s rate')
    found = report.parse_result_lines(output)
    if not found:
        raise BenchError('the rate benchmark printed no BENCHMARK line; see %s' % log)
    return found[0]['images_per_sec_global'], found[0]['startup_sec'] or 60.0


def hand_steps(budget_seconds, spent, rate, startup, evaluations, val_images):
    """Steps of the hand recipe that fit the budget after `spent` seconds (the converter): its
    start-up, its evaluations (val_images at three times the training rate, 3 s each more) and
    the prediction take the rest."""
    other = spent + startup + PREDICT_SECONDS + evaluations * (3.0 + val_images / (3 * rate))
    return max(20, int((budget_seconds - other) * rate / BATCH))


def hand_recipe(data_set, built, pth, directory):
    """The set's hand recipe in its budget: {'AP50', 'minutes', 'steps'}."""
    record = os.path.join(directory, 'hand.json')
    if os.path.exists(record):
        with open(record) as stream:
            return json.load(stream)
    recipe, evaluations, tiled = RECIPES[data_set.hand]
    log = os.path.join(directory, 'hand.log')
    records = os.path.join(directory, 'records')
    convert, val_images = _convert(built, records, tiled, log)
    weights = pth if data_set.hand == 'trees' else None
    rate, startup = _rate(recipe, records, weights, directory, log)
    steps = hand_steps(data_set.budget_minutes * 60.0, convert, rate, startup, evaluations,
                       val_images)
    per_epoch = max(BATCH, int(round(steps / float(evaluations))) * BATCH)
    model_dir = os.path.join(directory, 'hand')
    val_json = os.path.join(records, 'val-tiles.json') if tiled else built['val_json']
    # Held to the budget as the one command is (with its training floor, core/run_end.py):
    # a rate that came out faster than the training then runs (37.4 against 28.1 images/s on
    # shapes-300) would give it more time.
    stop = max(run_end.MIN_TRAINING_SECONDS,
               data_set.budget_minutes * 60.0 - convert - PREDICT_SECONDS)
    planned = per_epoch * evaluations // BATCH
    train, _ = _run([sys.executable, 'main.py', '--hparams=%s' % recipe,
                     '--num_examples_per_epoch=%d' % per_epoch, '--model_dir=%s' % model_dir,
                     '--training_file_pattern=%s' % os.path.join(records, 'train-*.tfrecord'),
                     '--validation_file_pattern=%s' % os.path.join(records, 'val-*.tfrecord'),
                     '--val_json_file=%s' % val_json]
                    + (['--backbone_ckpt=%s' % weights] if weights else []),
                    data_set.budget_minutes * 180 + 1800, log, 'the hand recipe', stop)
    reached = run_end.latest_step(model_dir) or 0
    stopped = reached < planned
    # Stopped at the budget: its latest checkpoint, trained furthest (best/ holds the first of
    # its two evaluations at most).
    best = os.path.join(model_dir, 'best')
    predict, _ = _run([sys.executable, 'inference.py', 'predict', '--model_dir=%s' % model_dir,
                       '--input=%s' % built.get('val_input', built['val_image_dir']),
                       '--output_dir=%s' % os.path.join(directory, 'hand-predict'),
                       '--annotations_file=%s' % built['val_json']]
                      + (['--checkpoint=%s' % best] if os.path.isdir(best) and not stopped
                         else [])
                      + (TILES if tiled else []), 7200, log, 'inference.py predict')
    with open(os.path.join(directory, 'hand-predict', 'metrics.json')) as stream:
        metrics = json.load(stream)
    result = {'AP50': metrics.get('AP50'), 'AP': metrics.get('AP'),
              'minutes': round((convert + train + predict) / 60.0, 1),
              'steps': reached, 'steps_planned': planned, 'stopped': stopped,
              'rate': round(rate, 2)}
    atomic_file.write_json_atomically(record, result)
    return result


def select(names, quick):
    sets = finetune_sets.QUICK_SETS if quick else finetune_sets.SETS
    known = {s.name: s for s in finetune_sets.SETS + finetune_sets.QUICK_SETS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise BenchError('--sets=%s: no set %s; choose among %s' % (
            ','.join(names), ', '.join(unknown), ', '.join(known)))
    return [known[name] for name in names] if names else list(sets)


def markdown(result):
    header = [title for title, _, _ in COLUMNS]
    rows = [[fmt % row[key] if row.get(key) is not None else '-' for _, key, fmt in COLUMNS]
            for row in result['rows']]
    return ('`%s` on %s, %s (%.0f min in all)\n\n%s\n' % (
        result['command'], result['cpu'], result['date'], result['minutes'],
        report.markdown_table(header, rows, text_columns=1)))


def run(names=(), quick=False, output=None, work=None):
    """Runs both sides of each set; returns {'rows', 'cpu', 'date', 'command', 'minutes'}."""
    work = os.path.abspath(work or os.path.join(
        report.REPO, 'runs', 'finetune-suite' + ('-quick' if quick else '')))
    started = time.time()
    pth = finetune_sets.lite0_pth(os.path.join(work, 'downloads'))
    rows = []
    for data_set in select(list(names), quick):
        directory = os.path.join(work, 'runs', data_set.name)
        built = data_set.build(os.path.join(work, 'data', data_set.name), quick)
        one = one_command(data_set, built, pth, directory)
        hand = hand_recipe(data_set, built, pth, directory)
        rows.append({'set': data_set.name, 'what': data_set.what,
                     'budget_minutes': data_set.budget_minutes, 'finetune_AP50': one['AP50'],
                     'finetune_minutes': one['minutes'], 'finetune_steps': one['steps'],
                     'finetune_ended': one['ended'], 'plan': one['plan'],
                     'hand': os.path.basename(RECIPES[data_set.hand][0]) + (
                         ' (stopped at the budget)' if hand.get('stopped') else ''),
                     'hand_AP50': hand['AP50'], 'hand_minutes': hand['minutes'],
                     'hand_steps': hand['steps']})
        print('%s: one command AP50 %s in %.1f min, %s AP50 %s in %.1f min (budget %g)' % (
            data_set.name, one['AP50'], one['minutes'], data_set.hand, hand['AP50'],
            hand['minutes'], data_set.budget_minutes), flush=True)
    result = {'bench': 'finetune_suite', 'rows': rows, 'cpu': report.cpu_description(),
              'date': time.strftime('%Y-%m-%d'), 'quick': quick, 'work': work,
              'command': 'python bench.py finetune_suite' + (' --quick' if quick else ''),
              'minutes': (time.time() - started) / 60.0}
    if output:
        atomic_file.write_text_atomically(output, markdown(result))
    return result
