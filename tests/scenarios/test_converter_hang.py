"""The converter's parallel error path ends every time (issue: a worker that died holding
multiprocessing.Pool's queue lock once left the converter waiting 35 minutes after a bad
image). core/worker_pool.py is tested on its own in test_worker_pool.py; here the real
converter, on real JPEGs, in fresh processes."""
import json
import os

import pytest

from cli_runs import assert_one_line_error, run_python
from efficientdet_hpu.datatools import synthetic_coco

# Round N truncates image N % 12 of 12, so 12 rounds put the failure at each place once (its
# shard, its moment). Each round spawns two workers that import TensorFlow: about 3.3 s on a
# free 2-core machine, 8 on a busy one (CONVERTER_ERROR_ROUNDS=N for more).
ROUNDS = int(os.environ.get('CONVERTER_ERROR_ROUNDS', 12))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_error_path_ends_within_its_deadline_round_after_round():
    """ROUNDS conversions in a row, each with one truncated JPEG among 4 shards on 2 worker
    processes: each names the image, leaves nothing and no worker (converter_error_loop.py)."""
    result = run_python(['tests/fixtures/converter_error_loop.py', str(ROUNDS)], timeout=1400)
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'ok %d rounds' % ROUNDS in result.stdout
    assert result.stdout.count('nothing left') == ROUNDS


@pytest.mark.slow
def test_the_command_prints_one_line_and_leaves_no_shard(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path / 'data'), num_train=8, num_val=1, seed=3)
    with open(paths['train_annotations'], encoding='utf-8') as stream:
        broken = json.load(stream)['images'][5]['file_name']
    image = os.path.join(paths['train_image_dir'], broken)
    with open(image, 'rb') as stream:
        data = stream.read()
    with open(image, 'wb') as stream:
        stream.write(data[:len(data) // 3])
    result = run_python(['-m', 'dataset.create_coco_tfrecord',
                         '--image_dir=%s' % paths['train_image_dir'],
                         '--object_annotations_file=%s' % paths['train_annotations'],
                         '--output_file_prefix=%s' % (tmp_path / 'out' / 'train'),
                         '--num_shards=4', '--num_threads=2'], timeout=300)
    assert_one_line_error(result, broken, starts_with='create_coco_tfrecord: error:')
    assert os.listdir(tmp_path / 'out') == []
