"""The Python API on the shared tiny trained model: Detector.predict gives the detections.json
rows of `inference.py predict` (run as a command) for a training run, a SavedModel, a TFLite
and an ONNX file, tiled too; every input kind gives the file's detections; README's and
docs/python-api.md's examples run as written; efficientdet_hpu.train runs main.py, returns its
summary and stops at Ctrl-C with a checkpoint; `import efficientdet_hpu` loads no TensorFlow;
bad paths and inputs are one line."""
import collections
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import efficientdet_hpu
from efficientdet_hpu.cli import training_run
from efficientdet_hpu.core import errors
from efficientdet_hpu.engine import checkpoint_eval
from efficientdet_hpu.serving import python_api
from efficientdet_hpu.serving import sources
from efficientdet_hpu.serving.model_spec import InferenceError
from cli_runs import REPO, run_process, run_python, tiny_flags

README_SECTION = '## Use the detector from Python'
PYTHON_BLOCK = re.compile(r'^```python\n(.*?)^```', re.MULTILINE | re.DOTALL)
NAMES = {3: 'ellipse', 17: 'rectangle', 42: 'triangle', 90: 'cross'}  # The synthetic data's.
STEP_LINE = re.compile(r'step (\d+)/\d+ loss')


@pytest.fixture(name='exported')
def exported_fixture(tiny_export):
    """The tiny run exported as a SavedModel with TFLite and ONNX files beside it (conftest)."""
    return tiny_export['export_dir']


@pytest.fixture(scope='module')
def photos(tiny_dataset, tmp_path_factory):
    """Three validation JPEGs, a grayscale PNG and a file that is no image."""
    directory = tmp_path_factory.mktemp('api_photos')
    val = os.path.join(tiny_dataset['root'], 'val')
    for name in sorted(os.listdir(val))[:3]:
        shutil.copy(os.path.join(val, name), directory / name)
    gray = np.random.default_rng(0).integers(0, 255, [90, 150], dtype=np.uint8)
    Image.fromarray(gray, 'L').save(directory / 'gray.png')
    (directory / 'broken.jpg').write_bytes(b'not an image')
    return directory


@pytest.fixture(scope='module')
def run_detector(tiny_trained_run):
    detector = efficientdet_hpu.Detector(tiny_trained_run)
    yield detector
    detector.close()


def _cli_rows(model_flag, input_path, output_dir, *extra):
    result = run_python(['inference.py', 'predict', model_flag, '--input=%s' % input_path,
                         '--output_dir=%s' % output_dir, '--min_score=0'] + list(extra),
                        timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]
    with open(os.path.join(output_dir, 'detections.json')) as f:
        return json.load(f)


def _jpegs(photos):
    """The photos' JPEG files (not the broken one), sorted."""
    return sorted(str(path) for path in photos.glob('*.jpg') if path.name != 'broken.jpg')


def _rows(results):
    return [row for result in results for row in result.to_coco()]


@pytest.mark.parametrize('kind', python_api.FORMATS)
def test_predict_gives_the_rows_of_inference_py_predict(kind, tiny_trained_run, exported,
                                                       photos, tmp_path):
    path, flag = {
        'model_dir': (tiny_trained_run, '--model_dir'),
        'saved_model': (exported, '--saved_model'),
        'tflite': (os.path.join(exported, 'model_fp32.tflite'), '--tflite'),
        'onnx': (os.path.join(exported, 'model_fp32.onnx'), '--onnx')}[kind]
    expected = _cli_rows('%s=%s' % (flag, path), photos, tmp_path / 'cli')
    with efficientdet_hpu.Detector(path) as detector:
        assert detector.format == kind and detector.names == NAMES
        results = detector.predict(str(photos), score_threshold=0)
    assert [os.path.basename(r.path) for r in results] == sorted(
        name for name in os.listdir(photos) if name != 'broken.jpg')  # Skipped, as the CLI.
    assert len(expected) > 100 and {row['category_name'] for row in expected} <= set(
        NAMES.values())
    assert _rows(results) == expected  # Same pixels, same predictor: the same numbers.
    for result in results:
        assert result.boxes.dtype == np.float32 and result.boxes.shape == (len(result), 4)
        assert (result.boxes[:, 2] >= result.boxes[:, 0]).all()
        assert (result.boxes[:, [0, 2]] <= result.width).all()
        assert (result.boxes[:, [1, 3]] <= result.height).all()


def test_tiled_predict_gives_the_rows_of_inference_py_predict(run_detector, tiny_trained_run,
                                                             photos, tmp_path):
    photo = _jpegs(photos)[-1]
    expected = _cli_rows('--model_dir=%s' % tiny_trained_run, photo, tmp_path / 'cli',
                         '--tile_size=64', '--tile_overlap=8', '--tile_batch_size=3')
    (result,) = run_detector.predict(photo, tile_size=64, tile_overlap=8, tile_batch_size=3,
                                     score_threshold=0)
    assert result.to_coco() == expected
    assert len(result) > 100 and result.boxes[:, 2].max() > 64  # Several tiles' detections.
    with pytest.raises(InferenceError, match='tile_overlap=64 must be .* smaller than '
                                             'tile_size=64'):
        run_detector.predict(photo, tile_size=64)


def test_every_input_kind_gives_the_files_detections(run_detector, photos):
    path = _jpegs(photos)[0]
    (from_file,) = run_detector.predict(path, score_threshold=0)
    pixels = np.asarray(Image.open(path).convert('RGB'))
    inputs = [Image.open(path), pixels, np.stack([pixels, pixels]), [pixels, path]]
    for source in inputs:
        for result in run_detector.predict(source, score_threshold=0):
            np.testing.assert_array_equal(result.boxes, from_file.boxes)
            np.testing.assert_array_equal(result.scores, from_file.scores)
            assert result.class_names == from_file.class_names
    glob_results = run_detector.predict(str(photos / '*.jpg'), score_threshold=0, stream=True)
    assert not isinstance(glob_results, list)
    assert [r.path for r in glob_results] == _jpegs(photos)  # broken.jpg skipped.
    # In memory: no file name; the image's place in the input is its image_id.
    rows = run_detector.predict([pixels, pixels], score_threshold=0)[1].to_coco()
    assert rows and {row['image_id'] for row in rows} == {2} and 'file_name' not in rows[0]


def test_threshold_cap_and_drawing(run_detector, photos, tmp_path):
    path = _jpegs(photos)[0]
    (everything,) = run_detector.predict(path, score_threshold=0)
    median = float(np.median(everything.scores))
    (kept,) = run_detector.predict(path, score_threshold=median)
    assert len(kept) == int((everything.scores >= median).sum()) < len(everything)
    (capped,) = run_detector.predict(path, score_threshold=0, max_detections=5)
    np.testing.assert_array_equal(capped.boxes, everything.boxes[:5])
    assert (np.diff(everything.scores) <= 0).all()  # Best first.
    assert 'Detections %s' % path in repr(everything)

    saved = capped.save(str(tmp_path / 'drawn' / 'photo.png'))
    with Image.open(saved) as drawn, Image.open(path) as original:
        assert drawn.size == original.size
        changed = np.abs(np.asarray(drawn, np.int16)
                         - np.asarray(original.convert('RGB'), np.int16)).max(axis=-1) > 0
    x1, y1, x2, y2 = capped.boxes[0].round().astype(int)
    assert changed[y1:y2 + 1, x1:x2 + 1].any()  # The best box's outline is drawn.
    assert capped.plot().shape == (capped.height, capped.width, 3)
    assert capped.draw(min_score=1.1).tobytes() == Image.open(path).convert('RGB').tobytes()


def test_checkpoint_choice(tiny_trained_run, run_detector, photos):
    path = _jpegs(photos)[0]
    assert run_detector.checkpoint == os.path.join(tiny_trained_run, 'model.ckpt-2')
    assert python_api.BEST_DIR == checkpoint_eval.BEST_DIR  # Where evaluation keeps 'best'.
    with efficientdet_hpu.Detector(tiny_trained_run, checkpoint=0) as first:
        assert first.checkpoint == os.path.join(tiny_trained_run, 'model.ckpt-0')
        (at_0,) = first.predict(path, score_threshold=0)
    (at_2,) = run_detector.predict(path, score_threshold=0)
    assert not np.array_equal(at_0.scores, at_2.scores)  # Other weights were loaded.
    with pytest.raises(InferenceError, match=r"best does not exist; evaluation keeps .* use "
                                             r"checkpoint='latest'"):
        efficientdet_hpu.Detector(tiny_trained_run, checkpoint='best')
    # A step as text and a prefix relative to the run name the same checkpoint.
    for named in ('0', 'model.ckpt-0'):
        with efficientdet_hpu.Detector(tiny_trained_run, checkpoint=named) as same:
            assert same.checkpoint == os.path.join(tiny_trained_run, 'model.ckpt-0')
            assert np.array_equal(same.predict(path, score_threshold=0)[0].scores,
                                  at_0.scores)
    with pytest.raises(InferenceError) as error:
        efficientdet_hpu.Detector(tiny_trained_run, checkpoint=7)
    assert str(error.value) == ("checkpoint=7: no checkpoint %s/model.ckpt-7; %s holds steps "
                                "0, 2 (pass a step, 'latest' or 'best')"
                                % (tiny_trained_run, tiny_trained_run))
    with pytest.raises(InferenceError, match=r"^label_map='gone.json': no such file; pass a "
                                             r"label map JSON"):
        efficientdet_hpu.Detector(tiny_trained_run, label_map='gone.json')


def test_a_damaged_checkpoint_names_the_intact_one_as_the_argument_to_pass(tiny_trained_run,
                                                                           tmp_path):
    model_dir = str(tmp_path / 'run')
    shutil.copytree(tiny_trained_run, model_dir)
    data = glob.glob(os.path.join(model_dir, 'model.ckpt-2.data-*'))[0]
    os.truncate(data, os.path.getsize(data) // 2)  # A copy that died half-way.
    with pytest.raises(errors.UserError) as error:
        efficientdet_hpu.Detector(model_dir)
    assert str(error.value).startswith('%s/model.ckpt-2 is damaged: ' % model_dir), error.value
    assert str(error.value).endswith("pass checkpoint='%s/model.ckpt-0' (the newest intact "
                                     "checkpoint there) or restore a copy" % model_dir)
    with efficientdet_hpu.Detector(model_dir, checkpoint=0) as intact:  # The fix, followed.
        assert intact.checkpoint == os.path.join(model_dir, 'model.ckpt-0')


def test_a_run_without_a_checkpoint_and_an_unfinished_finetune_are_one_line(tiny_trained_run,
                                                                            tmp_path):
    untrained = tmp_path / 'untrained'
    untrained.mkdir()
    shutil.copy(os.path.join(tiny_trained_run, 'config.yaml'), untrained)
    with pytest.raises(InferenceError, match=r'untrained holds no checkpoint yet; train into '
                                             r'it first \(a fine-tune: rerun its command\)$'):
        efficientdet_hpu.Detector(untrained)
    finetune = tmp_path / 'finetune'
    finetune.mkdir()
    (finetune / 'plan.json').write_text('{}')
    with pytest.raises(InferenceError, match=r"a fine-tune that has not trained yet \(no "
                                             r"model/config.yaml\); rerun its finetune.py"):
        efficientdet_hpu.Detector(finetune)
    shutil.copytree(untrained, finetune / 'model')
    with pytest.raises(InferenceError, match='model holds no checkpoint yet'):
        efficientdet_hpu.Detector(finetune)


def test_paths_that_are_no_model_are_one_line(tmp_path):
    (tmp_path / 'weights.pt').write_bytes(b'\x00' * 64)
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'export').mkdir()
    (tmp_path / 'export' / 'saved_model.pb').write_bytes(b'')
    (tmp_path / 'model.bin').write_bytes(b'\x1c\x00\x00\x00TFL3' + b'\x00' * 8)
    assert python_api.sniff(tmp_path / 'model.bin') == 'tflite'  # By its identifier.
    assert python_api.sniff(tmp_path / 'export') == 'saved_model'
    (tmp_path / 'model.ckpt-5.index').write_bytes(b'')
    with pytest.raises(InferenceError, match=r"a checkpoint file; pass the training run "
                                             r"directory holding it, with checkpoint="):
        efficientdet_hpu.Detector(tmp_path / 'model.ckpt-5.index')
    for path, what in ((tmp_path / 'weights.pt', 'a file that is neither a TFLite nor an '
                                                 'ONNX model'),
                       (tmp_path / 'empty', 'a directory with neither config.yaml nor '
                                            'saved_model.pb'),
                       (tmp_path / 'gone', 'no such file or directory')):
        with pytest.raises(InferenceError) as error:
            efficientdet_hpu.Detector(path)
        message = str(error.value)
        assert message.startswith("Detector('%s'): %s; pass a training run directory"
                                  % (path, what)) and '\n' not in message
        assert 'SavedModel directory, or a .tflite or .onnx file' in message
    with pytest.raises(InferenceError, match='apply to a training run directory'):
        efficientdet_hpu.Detector(tmp_path / 'export', checkpoint='best')


def test_tta_gives_the_rows_of_inference_py_predict_tta(run_detector, tiny_trained_run,
                                                       photos, tmp_path):
    """tta=True fuses the flips as `inference.py predict --tta` does, inside the tiles; a
    fine-tune whose evaluation kept them (summary.json's tta) fuses them by default."""
    photo = _jpegs(photos)[-1]
    expected = _cli_rows('--model_dir=%s' % tiny_trained_run, photo, tmp_path / 'cli',
                         '--tile_size=64', '--tile_overlap=8', '--tta')
    (fused,) = run_detector.predict(photo, tile_size=64, tile_overlap=8, score_threshold=0,
                                    tta=True)
    assert fused.to_coco() == expected
    (plain,) = run_detector.predict(photo, tile_size=64, tile_overlap=8, score_threshold=0)
    assert plain.to_coco() != expected
    tuned = tmp_path / 'mine'
    _run_dir_view(tiny_trained_run, tuned / 'model')
    (tuned / 'plan.json').write_text(json.dumps({'tile_size': 64, 'tile_overlap': 8}))
    (tuned / 'summary.json').write_text(json.dumps({'tta': True}))
    with efficientdet_hpu.Detector(tuned) as detector:
        assert detector.tta and 'tiles of 64 px, flips fused)' in repr(detector)
        assert detector.predict(photo, score_threshold=0)[0].to_coco() == expected
        assert detector.predict(photo, score_threshold=0, tta=False)[0].to_coco() == (
            plain.to_coco())
        with pytest.raises(InferenceError, match=r"^predict\(tta='yes'\): None, True or "
                                                 r"False"):
            detector.predict(photo, tta='yes')


def test_arguments_out_of_range_are_one_line(run_detector, photos, tmp_path):
    path = _jpegs(photos)[0]
    for keywords, message in (
            ({'score_threshold': '0.5'}, "score_threshold='0.5'): a number from 0 to 1"),
            ({'score_threshold': None}, 'score_threshold=None): a number from 0 to 1'),
            ({'max_detections': -1}, 'max_detections=-1): None or an int >= 1'),
            ({'max_detections': 0}, 'max_detections=0): None or an int >= 1'),
            ({'tile_size': -5}, 'tile_size=-5): None, 0 (whole images) or an int of pixels'),
            ({'tile_size': 64.0}, 'tile_size=64.0): None, 0 (whole images) or an int'),
            ({'tile_size': 64, 'tile_batch_size': 0}, 'tile_batch_size=0): an int >= 1')):
        with pytest.raises(InferenceError) as error:
            run_detector.predict(path, **keywords)
        assert str(error.value).startswith('predict(' + message), error.value
    with pytest.raises(InferenceError, match=r'^an array of shape \(0, 0, 3\) is an image '
                                             r'without pixels'):
        run_detector.predict(np.zeros((0, 0, 3), np.uint8))
    with pytest.raises(InferenceError, match=r'^an array of shape \(0, 8, 8, 3\) is a batch of '
                                             r'no image; pass at least one'):
        run_detector.predict(np.zeros((0, 8, 8, 3), np.uint8))
    (result,) = run_detector.predict(path, max_detections=np.int64(3), score_threshold=0)
    assert len(result) == 3
    with pytest.raises(InferenceError, match=r"^save\('.*noext'\): name an image file PIL "
                                             r"can write, such as 'photo.jpg'"):
        result.save(str(tmp_path / 'noext'))
    assert not os.path.exists(tmp_path / 'noext')
    assert os.path.isfile(result.save(tmp_path / 'drawn.png'))  # A pathlib.Path works too.


def test_sources_expand_and_refuse(tmp_path):
    for name in ('b.jpg', 'a.png', 'notes.txt'):
        (tmp_path / name).write_bytes(b'')
    assert [item.path for item in sources.expand(str(tmp_path))] == [
        str(tmp_path / 'a.png'), str(tmp_path / 'b.jpg')]  # A folder: its images, sorted.
    items = sources.expand([tmp_path / 'b.jpg', np.zeros([2, 5, 4, 3], np.uint8),
                            str(tmp_path / '*.png')])
    assert [item.position for item in items] == [1, 2, 3, 4]
    assert items[1].pixels.shape == (5, 4, 3) and items[3].path == str(tmp_path / 'a.png')
    (tmp_path / 'none').mkdir()
    for source, needle in (
            (str(tmp_path / 'none'), 'folder %s holds no image file' % (tmp_path / 'none')),
            (str(tmp_path / 'x.jpg'), '%s does not exist; pass an image file, a folder'
             % (tmp_path / 'x.jpg')),
            (str(tmp_path / '*.gif'), 'matches no file'),
            (np.zeros([4, 4, 3], np.float32), 'an array of shape (4, 4, 3) and dtype float32 '
                                              'is not an image'),
            (np.zeros([4, 4], np.uint8), 'shape (4, 4)'),
            (b'bytes', 'predict got a bytes object'), ([], 'predict got an empty list')):
        with pytest.raises(InferenceError) as error:
            sources.expand(source)
        assert needle in str(error.value) and '\n' not in str(error.value)


def test_importing_the_package_loads_no_tensorflow():
    code = ('import sys, efficientdet_hpu\n'
            'assert "tensorflow" not in sys.modules, "TensorFlow imported"\n'
            'from efficientdet_hpu import launch\n'  # Sub-packages still import as before.
            'print(sorted(efficientdet_hpu.__all__))\n')
    result = run_process([sys.executable, '-c', code], timeout=60, stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["['Detections',", "'Detector',", "'InferenceError',",
                                     "'LAYERS',", "'TrainingRun',", "'UserError',", "'train']"]
    assert efficientdet_hpu.Detector is python_api.Detector
    assert issubclass(efficientdet_hpu.InferenceError, efficientdet_hpu.UserError)
    with pytest.raises(efficientdet_hpu.InferenceError, match='no such file or directory'):
        efficientdet_hpu.Detector('/nonexistent/model_dir')
    assert efficientdet_hpu.train is training_run.train
    with pytest.raises(AttributeError, match="has no attribute 'Detectr'"):
        efficientdet_hpu.Detectr  # pylint: disable=pointless-statement


def test_flag_arguments():
    assert training_run.flag_arguments({
        'train_batch_size': 8, 'use_amp': True, 'deterministic': False, 'seed': None,
        'hparams': {'image_size': 128, 'nms_configs.iou_thresh': 0.6},
        'profile_steps': (2, 4)}) == [
        '--train_batch_size=8', '--use_amp=true', '--deterministic=false',
        '--hparams=image_size=128,nms_configs.iou_thresh=0.6', '--profile_steps=2,4']


def _run_dir_view(run, directory, best=None):
    """directory: symlinks to each file of the shared read-only run (an example may add files
    beside them; none is written through), with a model_dir/best of checkpoint `best`."""
    directory.mkdir(parents=True)
    for name in os.listdir(run):
        os.symlink(os.path.join(run, name), directory / name)
    if best:
        (directory / 'best').mkdir()
        for name in os.listdir(run):
            if name.startswith(best + '.'):
                os.symlink(os.path.join(run, name), directory / 'best' / name)
        (directory / 'best' / 'checkpoint').write_text('model_checkpoint_path: "%s"\n' % best)
        (directory / 'best' / 'best_eval.json').write_text(json.dumps(
            {'step': 2, 'checkpoint': best, 'AP': 0.0, 'metrics': {'AP': 0.0}}))


def _run_example(code, cwd):
    """`python -c code` in cwd, importing this checkout's package."""
    result = run_python(['-c', code], cwd=str(cwd), timeout=300, env={'PYTHONPATH': REPO})
    assert result.returncode == 0, code + '\n' + result.stdout[-5000:]
    return result.stdout


def test_readme_example_runs_as_written(tiny_trained_run, tiny_dataset, run_detector,
                                        tmp_path):
    with open(os.path.join(REPO, 'README.md')) as f:
        section = f.read().split(README_SECTION + '\n', 1)[1].split('\n## ', 1)[0]
    code = PYTHON_BLOCK.search(section).group(1)
    assert len(code.strip().splitlines()) < 10
    (tmp_path / 'runs').mkdir()
    os.symlink(tiny_trained_run, tmp_path / 'runs' / 'demo')
    val = os.path.join(tiny_dataset['root'], 'val')
    shutil.copy(os.path.join(val, sorted(os.listdir(val))[0]), tmp_path / 'photo.jpg')
    # As written, then with every detection kept (the tiny model's scores are under 0.3).
    everything = code.replace("predict('photo.jpg')", "predict('photo.jpg', score_threshold=0)")
    assert everything != code
    output = _run_example(code + '\nprint("--- every detection")\n' + everything, tmp_path)
    as_written, kept = output.split('--- every detection\n')
    width, height = Image.open(tmp_path / 'photo.jpg').size
    assert 'Detections photo.jpg %dx%d' % (width, height) in as_written
    lines = re.findall(r'^(\w+) (\d\.\d\d) at x1, y1, x2, y2 = \[', kept, re.MULTILINE)
    # Every detection the model gives the photo (up to 100; fewer where the clip to the photo
    # left a box without area).
    (result,) = run_detector.predict(str(tmp_path / 'photo.jpg'), score_threshold=0)
    assert 50 < len(lines) == len(result) <= 100
    assert {name for name, _ in lines} <= set(NAMES.values())
    with Image.open(tmp_path / 'photo-detections.jpg') as drawn:
        assert drawn.size == (width, height)


def test_docs_examples_run_as_written(tiny_trained_run, tiny_dataset, exported, tmp_path):
    with open(os.path.join(REPO, 'docs', 'python-api.md')) as f:
        blocks = PYTHON_BLOCK.findall(f.read())
    # The training example trains a D0 for hours; train() is run on a tiny run below.
    trains = [block for block in blocks if 'efficientdet_hpu.train(' in block]
    runnable = [block for block in blocks if block not in trains]
    assert len(trains) == 1 and len(runnable) >= 7
    _run_dir_view(tiny_trained_run, tmp_path / 'runs' / 'demo', best='model.ckpt-2')
    os.symlink(exported, tmp_path / 'runs' / 'demo' / 'saved_model')
    # A fine-tune's output folder: its plan and its main.py run (finetune/runner.py's Layout).
    _run_dir_view(tiny_trained_run, tmp_path / 'runs' / 'mine' / 'model', best='model.ckpt-2')
    (tmp_path / 'runs' / 'mine' / 'plan.json').write_text(json.dumps(
        {'tile_size': 64, 'tile_overlap': 8}))
    val = os.path.join(tiny_dataset['root'], 'val')
    names = sorted(os.listdir(val))
    shutil.copy(os.path.join(val, names[0]), tmp_path / 'photo.jpg')
    (tmp_path / 'photos').mkdir()
    for name in names[1:3]:
        shutil.copy(os.path.join(val, name), tmp_path / 'photos' / name)
    output = _run_example('\n'.join(runnable) + '\nprint(tuned)', tmp_path)
    assert "model_dir, checkpoint model.ckpt-2" in output
    assert ('<Detector runs/mine (finetune, checkpoint model/best/model.ckpt-2, tiles of 64 px)'
            in output)
    assert sorted(os.listdir(tmp_path / 'out')) == sorted(names[1:3] + ['detections.json'])
    with open(tmp_path / 'out' / 'detections.json') as f:
        rows = json.load(f)
    # Two photos, up to the model's 100 each (a box the clip leaves without area dropped).
    per_photo = collections.Counter(row['image_id'] for row in rows)
    assert len(per_photo) == 2 and all(50 < count <= 100 for count in per_photo.values())


def _keywords(flags):
    """tiny_flags' ['--name=value', ...] as train()'s keywords, without model_dir."""
    keywords = dict(flag[2:].split('=', 1) for flag in flags)
    del keywords['model_dir']
    return keywords


def test_train_returns_the_runs_summary(tiny_dataset, tmp_path):
    lines = []
    model_dir = str(tmp_path / 'run')
    run = efficientdet_hpu.train(model_dir=model_dir, mode='train_and_eval', quiet=True,
                                 on_line=lines.append, num_epochs=1,
                                 **_keywords(tiny_flags(tiny_dataset, model_dir)))
    assert run.exit_status == 0 and not run.stopped, '\n'.join(lines[-40:])
    assert run.step == 2 and run.checkpoint == os.path.join(model_dir, 'model.ckpt-2')
    assert run.metrics_step == 2 and 0 <= run.metrics['AP'] <= 1
    assert run.best_checkpoint == os.path.join(model_dir, 'best', 'model.ckpt-2')
    assert run.best_metrics['AP'] == run.metrics['AP']
    assert run.last_log['step'] == 2 and run.last_log['loss'] > 0
    assert run.output == lines[-training_run.TAIL_LINES:] and run.seconds > 0
    with run.detector('best') as detector:
        assert detector.checkpoint == run.best_checkpoint and detector.names == NAMES
    with pytest.raises(training_run.TrainingError,
                       match=r"^main\.py: error: .*trian_batch_size") as error:
        efficientdet_hpu.train(model_dir=model_dir, quiet=True, trian_batch_size=2)
    assert '\n' not in str(error.value)
    # time_limit sends the stop signal; this one comes while main.py is still starting.
    stopped_dir = str(tmp_path / 'stopped')
    run = efficientdet_hpu.train(model_dir=stopped_dir, quiet=True, time_limit=0.5,
                                 **_keywords(tiny_flags(tiny_dataset, stopped_dir)))
    assert run.stopped and run.exit_status in (-signal.SIGTERM, 128 + signal.SIGTERM) and run.step is None
    left = run_process(['pgrep', '-f', stopped_dir], timeout=30)
    assert left.returncode == 1, left.stdout


def test_ctrl_c_stops_training_at_a_checkpoint(tiny_trained_run, tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'run')
    shutil.copytree(tiny_trained_run, model_dir)  # Resumed at step 2.
    lines, interrupted = [], []

    def interrupt_at_step_4(line):
        lines.append(line)
        steps = STEP_LINE.findall(line)
        if steps and int(steps[0]) >= 4 and not interrupted:
            interrupted.append(line)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as a terminal or a notebook sends it.
    with pytest.raises(KeyboardInterrupt):
        efficientdet_hpu.train(model_dir=model_dir, quiet=True, on_line=interrupt_at_step_4,
                               num_epochs=1000, **_keywords(tiny_flags(tiny_dataset, model_dir)))
    stops = [re.search(r'stopped by SIGINT at step (\d+); checkpoint model\.ckpt-(\d+) '
                       r'written', line) for line in lines]
    (stop,) = [found for found in stops if found]
    summary = training_run.summary(model_dir)
    assert summary.step == int(stop.group(1)) == int(stop.group(2)) >= 4
    left = run_process(['pgrep', '-f', model_dir], timeout=30)
    assert left.returncode == 1, left.stdout  # No process of the run is left.
