"""benchmarks/finetune_sets.py and finetune_suite.py: the sets' formats as the fine-tune reads
them, the hand recipe's steps for a budget; slow: `bench.py finetune_suite --quick` runs both
sides of its set. finetune_costs.py: test_finetune_costs.py (a file of its own, so that the two
slow commands run on both test workers)."""
import json
import os
import sys

import pytest

from cli_runs import run_python
from efficientdet_hpu.benchmarks import finetune_sets
from efficientdet_hpu.benchmarks import finetune_suite
from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.datatools import synthetic_coco
from efficientdet_hpu.finetune import inputs


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    paths = synthetic_coco.generate(str(root), num_train=5, num_val=2, seed=4, num_classes=3)
    with open(paths['train_annotations']) as stream:
        return json.load(stream), paths, root


def test_voc_and_yolo_written_read_back_as_the_same_boxes(shapes):
    coco, paths, root = shapes
    finetune_sets.write_voc(coco, paths['train_image_dir'], str(root / 'voc'))
    voc = inputs.read('data', str(root / 'voc'), '')
    assert voc.line().startswith('Pascal VOC: 5 XML files, 5 photos')
    names = finetune_sets.write_yolo(coco, paths['train_image_dir'], str(root / 'yolo'), 'train')
    (root / 'yolo' / 'classes.txt').write_text('\n'.join(names) + '\n')
    yolo = inputs.read('data', str(root / 'yolo'), '')
    for read in (voc, yolo):
        assert len(read.coco['annotations']) == len(coco['annotations'])
        got = sorted(tuple(round(v) for v in a['bbox']) for a in read.coco['annotations'])
        want = sorted(tuple(a['bbox']) for a in coco['annotations'])
        assert all(max(abs(g - w) for g, w in zip(a, b)) <= 1 for a, b in zip(got, want))


def test_a_generated_set_moved_with_its_work_folder_reads_the_moved_files(tmp_path):
    """A rerun reuses a work folder, copied or moved: generated.json names the set's files
    and the folders' links point at photos inside it, not where it was first made."""
    first = tmp_path / 'first'
    made = finetune_sets._synthetic(str(first), 3, 2, 2, synthetic_coco.Look(), 1)
    assert all(os.path.exists(path) for path in made.values())
    finetune_sets.coco_folder(made['val_annotations'], made['val_image_dir'],
                              str(first / 'val_data'))
    os.rename(first, tmp_path / 'moved')
    links = [entry for entry in (tmp_path / 'moved' / 'val_data').iterdir() if entry.is_symlink()]
    assert len(links) == 2 and all(entry.exists() for entry in links)  # Followed in the move.
    moved = finetune_sets._synthetic(str(tmp_path / 'moved'), 3, 2, 2, synthetic_coco.Look(), 1)
    assert set(moved) == set(made)
    for key, path in moved.items():
        assert path == made[key].replace(str(first), str(tmp_path / 'moved'))
        assert os.path.exists(path)


def test_a_coco_folder_holds_links_and_one_json(shapes):
    _, paths, root = shapes
    folder = finetune_sets.coco_folder(paths['val_annotations'], paths['val_image_dir'],
                                       str(root / 'val_folder'))
    read = inputs.read('val_data', folder, '')
    assert read.line().startswith('COCO: instances.json, 2 photos')


def test_the_hand_recipe_fills_what_the_budget_leaves():
    # 10 min, 60 s converting, 30 s start-up, 60 s predicting, 20 evaluations of 20 tiles at
    # 3 x 10 images/s (3.67 s each, 73.3 s): 600 - 223.3 = 376.7 s of training at 10 images/s,
    # 470 steps of 8.
    assert finetune_suite.hand_steps(600, 60, 10.0, 30, 20, 20) == 470
    assert finetune_suite.hand_steps(100, 60, 10.0, 30, 20, 20) == 20  # At least 20.


def test_a_run_stopped_at_its_budget_is_kept_and_an_unasked_stop_status_is_a_failure(tmp_path):
    """The hand side's main.py is sent SIGTERM at the budget and exits with 128 + SIGTERM once
    its checkpoint is written (engine/preemption.py): that is its result, not a failure. The
    same status from a run nobody stopped is one."""
    exits_on_sigterm = [sys.executable, '-c', 'import signal, sys, time; signal.signal('
                        'signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM)); '
                        'print("started", flush=True); time.sleep(60)']
    run = finetune_suite._run  # pylint: disable=protected-access
    seconds, output = run(exits_on_sigterm, 120, str(tmp_path / 'log'), 'the hand recipe',
                          stop_after=1)
    assert seconds < 30 and 'started' in output
    exits_143 = [sys.executable, '-c', 'import sys; sys.exit(143)']
    with pytest.raises(BenchError, match='the hand recipe failed \\(exit 143\\)'):
        run(exits_143, 120, str(tmp_path / 'log'), 'the hand recipe')


def test_the_plan_column_says_where_the_flips_were_kept(tmp_path):
    """A finished fine-tune is read, not run again: its plan, and where its evaluation kept the
    flips, what the photos as they are scored."""
    out = tmp_path / 'finetune'
    out.mkdir()
    summary = {'AP50': 0.482, 'minutes': 17.9, 'model': 'efficientdet-lite0', 'image_size': 320,
               'tile_size': 320, 'steps_trained': 1077, 'training_ended': 'completed',
               'tta': True, 'views': {'as they are': {'AP': 0.111, 'AP50': 0.428},
                                      'flips fused': {'AP': 0.135, 'AP50': 0.482}}}
    (out / 'summary.json').write_text(json.dumps(summary))
    (out / 'plan.json').write_text(json.dumps({'reasons': [], 'weights': {'kind': 'backbone'}}))
    data_set = finetune_sets.SETS[0]
    row = finetune_suite.one_command(data_set, {}, '/unused.pth', str(tmp_path))
    assert row['AP50'] == 0.482
    assert row['plan'] == 'lite0 at 320 px, tiles; no search; flips fused (AP50 0.428 as they are)'
    (out / 'summary.json').write_text(json.dumps(dict(summary, tta=False)))
    row = finetune_suite.one_command(data_set, {}, '/unused.pth', str(tmp_path))
    assert row['plan'] == 'lite0 at 320 px, tiles; no search'


def test_unknown_sets_are_named():
    with pytest.raises(BenchError, match='no set nope; choose among shapes-300'):
        finetune_suite.select(['nope'], False)
    assert [s.name for s in finetune_suite.select([], False)] == [
        'shapes-300', 'deepforest', 'aerial-4000', 'classes-20', 'few-grey-50']


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_quick_suite_runs_both_sides(tmp_path):
    report = tmp_path / 'suite.md'
    result = run_python(['bench.py', 'finetune_suite', '--quick', '--work_dir=%s' % tmp_path,
                         '--output=%s' % report], timeout=2900)
    assert result.returncode == 0, result.stdout[-3000:]
    row = [line for line in report.read_text().splitlines() if 'quick-shapes' in line][0]
    cells = [cell.strip() for cell in row.strip('|').split('|')]
    assert cells[0] == 'quick-shapes' and cells[1] == '2' and cells[4] == 'demo.yaml'
    for ap50 in (cells[2], cells[5]):
        assert 0.0 <= float(ap50) <= 1.0
    assert os.path.exists(tmp_path / 'runs' / 'quick-shapes' / 'finetune' / 'summary.json')
