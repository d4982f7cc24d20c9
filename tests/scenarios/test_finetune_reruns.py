"""`python finetune.py` refused, the message's fix followed, the same command rerun: it goes on.

One output folder, one chain, as a user meets the refusals (each but the converter's before
anything is written): an Ultralytics .pt as --weights, replaced by a real Lite0 .pth; a class
of --val_data that --data lacks, added to the data; --max_minutes=1, then the minutes the
message names; a photo with corrupt pixels (the converter's refusal), taken out of the input
folder, whose label file is then named as having no image, and deleted: the rerun reads the
changed folder again and trains to the end. Then the finished run, rerun, prints its summary;
a photo added under the trained model is refused naming the command that starts afresh, and
that command (with --dry_run) plans. The tiny model trains 2 steps (--hparams' epochs).
"""
import json
import os
import re
import shlex

import numpy as np
import pytest
from PIL import Image, ImageDraw

from cli_runs import assert_one_line_error, run_python, TINY_HPARAMS
from torch_legacy_fixtures import write_legacy_pth
from weight_fixtures import LITE0_NAMES, write_ultralytics_pt

HPARAMS = TINY_HPARAMS + ',num_examples_per_epoch=8,num_epochs=1'  # 2 steps of 4 photos.
SIDE = 31


def _photo(path, index):
    """A 160 x 120 photo with a red and a blue square; returns their YOLO lines (class 0 red,
    1 blue)."""
    image = Image.new('RGB', (160, 120), (90, 120, 60))
    draw = ImageDraw.Draw(image)
    lines = []
    for label, (x, colour) in enumerate(((10, (200, 40, 40)), (80, (40, 40, 200)))):
        y = 15 + (7 * index) % 60
        draw.rectangle([x, y, x + SIDE - 1, y + SIDE - 1], fill=colour)
        lines.append('%d %.5f %.5f %.5f %.5f' % (label, (x + SIDE / 2) / 160, (y + SIDE / 2) / 120,
                                                 SIDE / 160, SIDE / 120))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image.save(path)
    return lines


def _yolo(folder, names, first=0, count=4, classes=(0, 1)):
    for index in range(first, first + count):
        lines = _photo(os.path.join(folder, 'images', 'y%d.jpg' % index), index)
        os.makedirs(os.path.join(folder, 'labels'), exist_ok=True)
        with open(os.path.join(folder, 'labels', 'y%d.txt' % index), 'w') as stream:
            stream.write(''.join(line + '\n' for line in lines if int(line[0]) in classes))
    text = ''.join(name + '\n' for name in names)
    path = os.path.join(folder, 'classes.txt')
    if not os.path.exists(path) or open(path).read() != text:  # A photo added: its label only.
        with open(path, 'w') as stream:
            stream.write(text)
    return folder


def _corrupt_photo(folder):
    """broken.jpg: its header (and so its size) reads, its pixels do not decode."""
    lines = _photo(os.path.join(folder, 'images', 'broken.jpg'), 9)
    path = os.path.join(folder, 'images', 'broken.jpg')
    with open(path, 'rb') as stream:
        data = stream.read()
    with open(path, 'wb') as stream:
        stream.write(data[:len(data) * 4 // 5])
    with open(os.path.join(folder, 'labels', 'broken.txt'), 'w') as stream:
        stream.write(lines[0] + '\n')


def _lite0_pth(path):
    """A .pth of EfficientNet-Lite0's names and shapes (the real file's, from the fixture) in
    PyTorch's legacy format, small random values."""
    rng = np.random.RandomState(0)
    with open(LITE0_NAMES) as stream:
        table = json.load(stream)
    write_legacy_pth(path, {name: (rng.normal(0, 0.01, shape).astype(dtype) if dtype == 'float32'
                                   else np.zeros(shape, dtype)) for name, shape, dtype in table})
    return path


def _finetune(data, out, weights, val, minutes, *extra, timeout=300):
    return run_python(['finetune.py', '--data=%s' % data, '--output_dir=%s' % out,
                       '--val_data=%s' % val, '--weights=%s' % weights,
                       '--max_minutes=%s' % minutes, '--hparams=%s' % HPARAMS] + list(extra),
                      timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_refusals_fix_followed_and_rerun_goes_on(tmp_path):
    data = _yolo(str(tmp_path / 'photos'), ['red'], classes=(0,))
    _corrupt_photo(data)
    val = _yolo(str(tmp_path / 'val'), ['red', 'blue'], first=10, count=1)
    out = str(tmp_path / 'run')
    # --weights of another model: named for what it is, nothing written.
    yolo = write_ultralytics_pt(str(tmp_path / 'yolov8n.pt'))
    result = _finetune(data, out, yolo, val, 1)
    assert_one_line_error(result, '--weights=%s is an Ultralytics YOLO model' % yolo,
                          'accepted: an EfficientNet-Lite ImageNet .pth')
    assert not os.path.exists(out)
    # Replaced by a real .pth: the next check, a class --val_data has and --data lacks.
    weights = _lite0_pth(str(tmp_path / 'efficientnet-lite0-57934424.pth'))
    result = _finetune(data, out, weights, val, 1)
    assert_one_line_error(result, '--val_data=%s has the classes blue, which --data does not'
                          % val, 'use the same class names')
    assert not os.path.exists(out)
    # The class added to the data: the budget is next.
    _yolo(data, ['red', 'blue'])
    result = _finetune(data, out, weights, val, 1)
    line = assert_one_line_error(result, '--max_minutes=1 is too short')
    assert not os.path.exists(out)
    minutes = int(re.search(r'give at least (\d+)$', line).group(1))
    # The minutes it names: the data and the plan are made, the converter finds the photo.
    result = _finetune(data, out, weights, val, minutes, timeout=900)
    assert_one_line_error(result, 'broken.jpg', 'Re-export or remove it from --data=%s. Then '
                          'rerun the same command: the changed folder is read again.' % data)
    assert 'efficientnet-lite0-57934424.pth (--backbone_ckpt' in result.stdout
    # The photo taken out of the folder: its label file is named, and deleted.
    os.remove(os.path.join(data, 'images', 'broken.jpg'))
    result = _finetune(data, out, weights, val, minutes)
    assert_one_line_error(result, '1 label file without an image', 'broken.txt',
                          '--drop_orphan_labels')
    os.remove(os.path.join(data, 'labels', 'broken.txt'))
    result = _finetune(data, out, weights, val, minutes, timeout=1200)
    assert result.returncode == 0, result.stdout[-5000:]
    assert ('the input changed since the last run (2 files removed (broken.jpg, broken.txt)): '
            'read again; the split, the data doctor, the plan and the records are redone'
            in result.stdout)
    assert 'YOLO: classes.txt, 4 photos, 2 classes, 8 boxes' in result.stdout
    with open(os.path.join(out, 'summary.json')) as stream:
        assert json.load(stream)['steps_trained'] == 2
    # The same command again: done. A photo added under the trained model: refused, naming
    # the command that starts afresh, which goes on.
    again = _finetune(data, out, weights, val, minutes)
    assert again.returncode == 0 and 'done earlier' in again.stdout, again.stdout[-3000:]
    _yolo(data, ['red', 'blue'], first=4, count=1)
    line = assert_one_line_error(_finetune(data, out, weights, val, minutes),
                                 'the data changed since %s/model was trained on it (2 files '
                                 'added (y4.jpg, y4.txt); now YOLO: classes.txt, 5 photos, 2 '
                                 'classes, 10 boxes): its checkpoints learnt the old data' % out)
    command = line.split('start afresh on the new data in another folder: ')[1]
    assert '--output_dir=%s-2' % out in command
    fresh = run_python(shlex.split(command)[1:] + ['--dry_run'], timeout=300)
    assert fresh.returncode == 0 and 'dry run: nothing written' in fresh.stdout, \
        fresh.stdout[-3000:]
