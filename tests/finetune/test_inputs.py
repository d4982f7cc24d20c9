"""finetune/inputs.py and weights.py: which format a folder holds, the errors for what is not
one, the split by photo, and what --weights names. Plain Python and PIL, no TensorFlow."""
import json
import os
import subprocess
import sys

import pytest

from cli_runs import run_process
from efficientdet_hpu.datatools.voc_to_coco import VocError
from efficientdet_hpu.datatools.yolo_to_coco import YoloError
from efficientdet_hpu.finetune import inputs
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import weights
from efficientdet_hpu.checkpoints import weight_files
from finetune_cases import make_coco, make_voc, make_yolo, photo as _photo
from weight_fixtures import write_legacy_lite, write_ultralytics_pt

def test_each_format_is_found_and_stated_in_one_line(tmp_path):
    coco = inputs.read('data', make_coco(str(tmp_path / 'coco')))
    assert coco.line() == 'COCO: instances.json, 3 photos, 1 class, 3 boxes'
    voc = inputs.read('data', make_voc(str(tmp_path / 'voc')), single_class='tree')
    assert voc.line() == ('Pascal VOC: 2 XML files, 2 photos, 1 class, 2 boxes, 1 image without '
                          'annotations left out')
    yolo = inputs.read('data', make_yolo(str(tmp_path / 'yolo')))
    assert yolo.line() == 'YOLO: classes.txt, 3 photos, 2 classes, 3 boxes'
    assert yolo.image_dir == str(tmp_path / 'yolo' / 'images')
    # A COCO .json named directly; VOC's labels merged only with single_class.
    assert inputs.read('data', str(tmp_path / 'coco' / 'instances.json')).format == 'COCO'
    assert [c['name'] for c in inputs.read('data', str(tmp_path / 'voc')).coco['categories']] == [
        'Dead', 'Tree']


def test_a_data_yaml_with_its_own_val_directory(tmp_path):
    root = tmp_path / 'ultra'
    make_yolo(str(root / 'train'), count=2)
    make_yolo(str(root / 'valid'), count=1)
    (root / 'data.yaml').write_text('names: [ant, bee]\ntrain: train/images\nval: valid/images\n')
    dataset = inputs.read('data', str(root))
    assert dataset.source == 'data.yaml' and len(dataset.coco['images']) == 2
    assert dataset.val_dir == str(root / 'valid' / 'images')


def test_an_unrecognised_or_ambiguous_folder_says_what_is_there_and_what_is_expected(tmp_path):
    photos = tmp_path / 'photos'
    _photo(str(photos / 'a.jpg'))
    (photos / 'notes.txt').write_text('x')
    with pytest.raises(inputs.InputError) as raised:
        inputs.read('data', str(photos))
    assert str(raised.value) == ('--data=%s holds 1 image and .txt, no annotations: expected %s'
                                 % (photos, inputs.EXPECTED))
    both = make_voc(make_coco(str(tmp_path / 'both')))
    with pytest.raises(inputs.InputError, match=r'ambiguous, it holds COCO: instances.json; '
                                                r'Pascal VOC: v0.xml, v1.xml'):
        inputs.read('data', both)
    with pytest.raises(inputs.InputError, match='does not exist'):
        inputs.read('val_data', str(tmp_path / 'absent'))


def test_bad_files_stop_with_the_converters_own_errors(tmp_path):
    voc = make_voc(str(tmp_path / 'voc'))
    os.remove(os.path.join(voc, 'v1.png'))
    with pytest.raises(VocError, match=r"v1.xml: image 'v1.png' is not in --image_dir"):
        inputs.read('data', voc)
    yolo = make_yolo(str(tmp_path / 'yolo'))
    with open(os.path.join(yolo, 'labels', 'y0.txt'), 'w') as stream:
        stream.write('0 0.5 0.5 3.0 0.2\n')
    with pytest.raises(YoloError, match=r'y0.txt:1: w=3.0 is outside \[0, 1\]'):
        inputs.read('data', yolo)


def test_a_cut_coco_json_is_named_with_its_parse_error_not_called_no_annotations(tmp_path):
    coco = make_coco(str(tmp_path / 'coco'))
    path = os.path.join(coco, 'instances.json')
    with open(path) as stream:
        text = stream.read()
    with open(path, 'w') as stream:
        cut = text[:text.index('"annotations"')]  # An interrupted copy: '..., '.
        stream.write(cut)
    expected = ('%s:1:%d: not valid JSON: Expecting property name enclosed in double quotes; '
                'the file ends there, cut short (an interrupted download or copy?): get it '
                'again' % (path, len(cut) + 1))
    with pytest.raises(inputs.InputError) as raised:
        inputs.read('data', coco)
    assert str(raised.value) == '--data=%s: %s' % (coco, expected)
    with pytest.raises(inputs.InputError) as raised:
        inputs.read('val_data', path)
    assert str(raised.value) == '--val_data=' + expected
    # A stray character mid-file: the position, and "fix the file there".
    with open(path, 'w') as stream:
        stream.write(text.replace('"images": [', '"images": ]', 1) + '\n')
    column = text.index('"images": [') + len('"images": ') + 1
    with pytest.raises(inputs.InputError, match=r'instances.json:1:%d: not valid JSON: Expecting '
                                                r'value; fix the file there$' % column):
        inputs.read('data', coco)
    # A broken JSON beside a plain VOC set is not the data set: ignored.
    voc = make_voc(str(tmp_path / 'voc'))
    with open(os.path.join(voc, 'notes.json'), 'w') as stream:
        stream.write('{"a": ')
    assert inputs.read('data', voc).format == 'Pascal VOC'


def test_yolo_negatives_are_counted_and_labels_without_an_image_refused(tmp_path):
    yolo = make_yolo(str(tmp_path / 'yolo'), count=4)
    os.remove(os.path.join(yolo, 'labels', 'y1.txt'))  # An image without a label file.
    open(os.path.join(yolo, 'labels', 'y2.txt'), 'w').close()  # An empty label file.
    assert inputs.read('data', yolo).line() == (
        'YOLO: classes.txt, 4 photos, 2 classes, 2 boxes, 2 images without boxes (1 without a '
        'label file, 1 with an empty one: negatives, as in YOLO)')
    os.remove(os.path.join(yolo, 'images', 'y3.jpg'))  # Its label file y3.txt stays.
    with pytest.raises(YoloError, match=r'1 label file without an image under .*images '
                                        r'\(.*labels/y3.txt\): its boxes would be lost; .* '
                                        r'--drop_orphan_labels'):
        inputs.read('data', yolo)
    dropped = inputs.read('data', yolo, drop_orphan_labels=True)
    assert dropped.line().endswith('1 with an empty one: negatives, as in YOLO), 1 label file '
                                   'without an image left out')
    assert len(dropped.coco['images']) == 3
    # COCO (and VOC): photos without boxes are counted as negatives too.
    coco = make_coco(str(tmp_path / 'coco'))
    path = os.path.join(coco, 'instances.json')
    with open(path) as stream:
        content = json.load(stream)
    with open(path, 'w') as stream:
        json.dump(dict(content, annotations=content['annotations'][1:]), stream)
    assert inputs.read('data', coco).line() == ('COCO: instances.json, 3 photos, 1 class, 2 '
                                                'boxes, 1 photo without boxes (negatives)')


def _images(names):
    return {'images': [{'id': i, 'file_name': 'dir/' + name, 'width': 10, 'height': 10}
                       for i, name in enumerate(names, 1)],
            'annotations': [{'id': i, 'image_id': i, 'category_id': 1, 'bbox': [1, 1, 2, 2]}
                            for i in range(1, len(names) + 1)],
            'categories': [{'id': 1, 'name': 'x'}]}


def _held(coco, val_photos=()):
    return sorted(image['file_name'] for image in inputs.split(coco, val_photos)[1]['images'])


def test_the_split_is_by_photo_from_the_file_names_only():
    names = ['photo%02d.jpg' % i for i in range(20)]
    held = _held(_images(names))
    assert len(held) == 4  # 20% of 20.
    assert _held(_images(list(reversed(names)))) == held  # Not the order given.
    # Another photo moves none of the held-out ones out (it may join them or not).
    grown = _held(_images(names + ['new.jpg']))
    assert set(held) <= set(grown)
    # Two photos: one held out; one photo: nothing to hold out.
    assert len(_held(_images(['a.jpg', 'b.jpg']))) == 1
    with pytest.raises(inputs.InputError, match='one photo'):
        inputs.split(_images(['a.jpg']))


def test_val_photos_name_photos_with_or_without_their_extension():
    coco = _images(['a.jpg', 'b.png', 'c.jpg'])
    assert _held(coco, ['b', 'c.jpg']) == ['dir/b.png', 'dir/c.jpg']
    train, val, how = inputs.split(coco, ['b'])
    assert len(train['annotations']) == 2 and len(val['annotations']) == 1
    assert inputs.split_line(train, val, how) == (
        'split by photo: 2 photos, 2 boxes to train; 1 photo, 1 box to validate (named by '
        '--val_photos)')
    with pytest.raises(inputs.InputError, match=r'--val_photos names d, not a photo of --data '
                                                r'\(there: a.jpg, b.png, c.jpg\)'):
        inputs.split(coco, ['d'])
    with pytest.raises(inputs.InputError, match='every photo'):
        inputs.split(coco, ['a', 'b', 'c'])


def test_validation_classes_are_matched_by_name():
    train = {'categories': [{'id': 1, 'name': 'ant'}, {'id': 2, 'name': 'bee'}]}
    val = {'images': [], 'categories': [{'id': 5, 'name': 'bee'}, {'id': 6, 'name': 'wasp'}],
           'annotations': [{'id': 1, 'image_id': 1, 'category_id': 5}]}
    assert inputs.align_categories(train, val, 'v')['annotations'][0]['category_id'] == 2
    val['annotations'].append({'id': 2, 'image_id': 1, 'category_id': 6})
    with pytest.raises(inputs.InputError, match='v has the classes wasp'):
        inputs.align_categories(train, val, 'v')


def test_weights_name_a_backbone_or_a_detector(tmp_path):
    pth = write_legacy_lite(str(tmp_path / 'efficientnet-lite0-57934424.pth'))
    assert weights.resolve(pth) == plan_lib.Weights('backbone', pth, 'efficientdet-lite0')
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-5"\n')
    # A TF checkpoint's .index, as TensorFlow writes it: the names are there as bytes.
    (run / 'model.ckpt-5.index').write_bytes(b'\x00\x00box_net/box-predict/bias\x00'
                                             b'\x00class_net/class-predict/bias\x00')
    (run / 'config.yaml').write_text('name: efficientdet-d1\n')
    assert weights.resolve(str(run)) == plan_lib.Weights('detector', str(run), 'efficientdet-d1')
    assert weights.resolve(str(run / 'model.ckpt-5.index')) == plan_lib.Weights(
        'detector', str(run / 'model.ckpt-5'), 'efficientdet-d1')
    assert weights.resolve('') == plan_lib.Weights()
    with pytest.raises(weight_files.WeightFileError, match='missing.pth is not there; '
                                                           'accepted: an EfficientNet-Lite'):
        weights.resolve(str(tmp_path / 'missing.pth'))
    with pytest.raises(weights.WeightsError, match="are efficientdet-lite0's but "
                                                   "--model_name=efficientdet-d0"):
        weights.resolve(pth, 'efficientdet-d0')
    # An Ultralytics .pt is named for what it is, never planned as "the detector".
    with pytest.raises(weight_files.WeightFileError, match='is an Ultralytics YOLO model'):
        weights.resolve(write_ultralytics_pt(str(tmp_path / 'yolov8n.pt')))


def test_the_command_itself_never_imports_tensorflow():
    """The fine-tune's own process stays light: TensorFlow runs in its child commands."""
    code = ('import sys\nfrom efficientdet_hpu.cli import finetune\n'
            'print("tensorflow" in sys.modules)\n')
    result = run_process([sys.executable, '-c', code], timeout=120, stderr=subprocess.PIPE)
    assert result.stdout.strip() == 'False', result.stderr[-2000:]


def test_coco_boxes_the_converter_drops_or_clips_are_said_and_not_evaluated(tmp_path):
    """The converter leaves out a box of no area or wholly outside its photo and clips one
    partly outside; the data line says so, and train.json / val.json hold the boxes as
    trained (a box left out there would count as unfound in every evaluation)."""
    coco = make_coco(str(tmp_path / 'coco'), count=6)
    path = os.path.join(coco, 'instances.json')
    with open(path) as stream:
        content = json.load(stream)
    for annotation, bbox in zip(content['annotations'], ([4, 4, 0, 10], [4, 4, 20, -1],
                                                         [70, 4, 5, 5], [50, 40, 20, 10])):
        annotation['bbox'] = bbox
    with open(path, 'w') as stream:
        json.dump(content, stream)
    dataset = inputs.read('data', coco)
    assert dataset.line() == (
        'COCO: instances.json, 6 photos, 1 class, 3 boxes, 2 boxes of no width or height left '
        'out (annotation id 1, ...), 1 box wholly outside their photo left out (annotation id '
        '3), 1 box partly outside the photo clipped to it, 3 photos without boxes (negatives)')
    clipped = next(a for a in dataset.coco['annotations'] if a['id'] == 4)
    assert clipped['bbox'] == [50.0, 40.0, 14.0, 8.0] and clipped['area'] == 112.0
    assert sorted(a['id'] for a in dataset.coco['annotations']) == [4, 5, 6]


def test_yolo_label_ids_name_the_label_file_as_it_sits_in_labels(tmp_path):
    """Ultralytics' images/train, labels/train: train/y0.txt:1 (not y0.txt:1, which the val
    split's labels/val/y0.txt would share); the plain layout's labels/y0.txt: y0.txt:1."""
    root = tmp_path / 'ultra'
    for split, count in (('train', 3), ('val', 1)):
        for i in range(count):
            _photo(str(root / 'images' / split / ('y%d.jpg' % i)))
            (root / 'labels' / split).mkdir(parents=True, exist_ok=True)
            (root / 'labels' / split / ('y%d.txt' % i)).write_text('0 0.5 0.5 0.25 0.25\n')
    (root / 'data.yaml').write_text('names: [ant]\ntrain: images/train\nval: images/val\n')
    dataset = inputs.read('data', str(root))
    assert sorted(a['source'] for a in dataset.coco['annotations']) == [
        'train/y0.txt:1', 'train/y1.txt:1', 'train/y2.txt:1']
    names = [dataset.coco['categories'][0]['name']]
    val = inputs.yolo_to_coco.coco_dataset(dataset.val_dir, names, None, False)
    assert [a['source'] for a in val['annotations']] == ['val/y0.txt:1']
    plain = inputs.read('data', make_yolo(str(tmp_path / 'plain')))
    assert [a['source'] for a in plain.coco['annotations']] == ['y0.txt:1', 'y1.txt:1',
                                                                 'y2.txt:1']
