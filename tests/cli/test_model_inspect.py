"""google/automl's `model_inspect.py --runmode=...` commands (efficientdet/README.md at 6a54c87,
sections 4 and 5) run as written on a model this project trained (cli/inspect_modes.py).

Only the model differs: --ckpt_path is the tiny_trained_run fixture (two training steps of
TINY_HPARAMS). Its scores are near the class prior (~0.01), so the infer commands pass
--min_score_thresh=0.001 where the README has 0.4: with 0.4 nothing would be drawn.
"""
import os

import numpy as np
from PIL import Image
import pytest

from cli_runs import assert_one_line_error, run_python
from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.cli import inspect_modes


def _inspect(*flags, timeout=600):
    return run_python(['model_inspect.py'] + list(flags), timeout=timeout)


def _grey_photo(path, size=(160, 120)):
    """A flat grey image: any drawn box is a run of pixels far from grey."""
    Image.new('RGB', size, (128, 128, 128)).save(str(path))
    return str(path)


def _drawn_pixels(output_path, input_path):
    """Pixels of the output image that differ from the input by more than JPEG noise."""
    drawn = np.asarray(Image.open(output_path).convert('RGB'), np.int32)
    original = np.asarray(Image.open(input_path).convert('RGB'), np.int32)
    assert drawn.shape == original.shape
    return int((np.abs(drawn - original).max(axis=-1) > 40).sum())


@pytest.fixture(scope='module')
def saved_model(tiny_trained_run, tmp_path_factory):
    """README section 5, step 1: `--runmode=saved_model` of the trained run."""
    export_dir = str(tmp_path_factory.mktemp('inspect') / 'saved_model')
    result = _inspect('--runmode=saved_model', '--model_name=efficientdet-d0',
                      '--ckpt_path=%s' % tiny_trained_run, '--saved_model_dir=%s' % export_dir,
                      '--min_score_thresh=0.001')
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'exported %s' % export_dir in result.stdout
    return export_dir


@pytest.mark.slow
def test_saved_model_export_loads_and_detects(saved_model):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    assert os.path.isfile(os.path.join(saved_model, 'saved_model.pb'))
    model = tf.saved_model.load(saved_model)
    outputs = model.signatures['serving_default'](
        images=tf.constant(np.full([1, 120, 160, 3], 128, np.uint8)))
    count = int(outputs['num_detections'][0])
    # min_score_thresh and max_boxes_to_draw are the NMS settings of the export, as in automl.
    assert 0 < count <= 100
    assert float(outputs['detection_scores'][0][count - 1]) >= 0.001


@pytest.mark.slow
def test_saved_model_infer_draws_boxes(saved_model, tmp_path):
    """README section 5, step 2, with two images at --batch_size=2: 0.jpg and 1.jpg."""
    first = _grey_photo(tmp_path / 'img.png')
    second = _grey_photo(tmp_path / 'img2.png')
    out = tmp_path / 'out'
    result = _inspect('--runmode=saved_model_infer', '--model_name=efficientdet-d0',
                      '--saved_model_dir=%s' % saved_model,
                      '--input_image=%s' % (tmp_path / 'img*.png'),
                      '--output_image_dir=%s' % out, '--batch_size=2',
                      '--min_score_thresh=0.001')
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'writing file to %s' % (out / '0.jpg') in result.stdout
    assert sorted(os.listdir(out)) == ['0.jpg', '1.jpg']
    assert _drawn_pixels(out / '0.jpg', first) > 100
    assert _drawn_pixels(out / '1.jpg', second) > 100


@pytest.mark.slow
def test_infer_from_the_checkpoint_draws_boxes(tiny_trained_run, tmp_path):
    """README section 5, `--runmode=infer`, with --hparams over the run's config.yaml."""
    image = _grey_photo(tmp_path / 'img.png')
    out = tmp_path / 'out'
    result = _inspect('--runmode=infer', '--model_name=efficientdet-d0',
                      '--hparams=image_size=192x128', '--max_boxes_to_draw=100',
                      '--min_score_thresh=0.001', '--ckpt_path=%s' % tiny_trained_run,
                      '--input_image=%s' % image, '--output_image_dir=%s' % out)
    assert result.returncode == 0, result.stdout[-3000:]
    assert os.listdir(out) == ['0.jpg']
    assert _drawn_pixels(out / '0.jpg', image) > 100
    # Nothing drawn above the README's threshold on this barely trained model: the drawing
    # follows --min_score_thresh.
    high = tmp_path / 'high'
    result = _inspect('--runmode=infer', '--ckpt_path=%s' % tiny_trained_run,
                      '--input_image=%s' % image, '--output_image_dir=%s' % high)
    assert result.returncode == 0, result.stdout[-3000:]
    assert _drawn_pixels(high / '0.jpg', image) == 0


@pytest.mark.slow
def test_benchmarks_print_a_time_and_fps(tiny_trained_run, saved_model, tmp_path):
    """README section 4: `--runmode=bm` (the network alone) and `saved_model_benchmark`."""
    result = _inspect('--runmode=bm', '--model_name=efficientdet-d0',
                      '--ckpt_path=%s' % tiny_trained_run)
    assert result.returncode == 0, result.stdout[-3000:]
    fps = [line for line in result.stdout.splitlines() if line.startswith('FPS: ')]
    assert len(fps) == 1 and float(fps[0].split()[1]) > 0
    (line,) = report.parse_result_lines(result.stdout)
    assert line['bench'] == 'model_inspect_bm' and line['steps'] == 10
    assert line['image_size'] == 128 and line['images_per_sec'] > 0
    image = _grey_photo(tmp_path / 'img.png')
    result = _inspect('--runmode=saved_model_benchmark', '--model_name=efficientdet-d0',
                      '--saved_model_dir=%s' % saved_model, '--input_image=%s' % image)
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'Per batch inference time: ' in result.stdout
    (line,) = report.parse_result_lines(result.stdout)
    assert line['steps'] == 10 and line['images_per_sec'] > 0


@pytest.mark.slow
@pytest.mark.parametrize('flags, expected', [
    (['--runmode=infer', '--ckpt_path=/tmp'],
     '--runmode=infer needs --input_image=IMAGE and --output_image_dir=DIR'),
    (['--runmode=saved_model_infer', '--saved_model_dir=/nonexistent', '--input_image=a.jpg',
      '--output_image_dir=/tmp/out'], '--saved_model_dir=/nonexistent holds no SavedModel'),
    (['--runmode=saved_model', '--ckpt_path=/nonexistent/model.ckpt-5'],
     'is neither a directory nor a checkpoint prefix'),
    (['--runmode=infer', '--ckpt_path=/tmp', '--input_image=/nonexistent/*.jpg',
      '--output_image_dir=/tmp/out'], '--input_image=/nonexistent/*.jpg matches no file'),
    (['--runmode=dry'], '--runmode=dry (automl) is not carried here'),
    (['--runmode=bm', '--tensorrt=FP32'], '--tensorrt is not carried here'),
    (['--input_image=a.jpg'], '--input_image needs a --runmode'),
])
def test_bad_flag_combinations_are_one_line(flags, expected):
    assert_one_line_error(_inspect(*flags, timeout=180), expected,
                          starts_with='model_inspect.py: error: ')


def test_thresholds_become_nms_overrides_as_in_automl():
    assert inspect_modes.hparams_with_nms('', 0.4, 100) == (
        'nms_configs.score_thresh=0.4,nms_configs.max_output_size=100')
    assert inspect_modes.hparams_with_nms('configs/demo.yaml,num_classes=3', 0.25, 0) == (
        'configs/demo.yaml,num_classes=3,nms_configs.score_thresh=0.25')
    assert inspect_modes.hparams_with_nms('a=1', 0.0, 0) == 'a=1'  # 0 keeps the config's.
