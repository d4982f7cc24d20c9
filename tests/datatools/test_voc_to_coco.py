"""Pascal VOC XML -> COCO JSON (datatools/voc_to_coco.py), worked by hand on tiny files with
real PNG/JPEG images written here."""
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

from cli_runs import run_process
from efficientdet_hpu.datatools import voc_to_coco

_XML = """<annotation><filename>{name}</filename>
<size><width>{w}</width><height>{h}</height><depth>3</depth></size>{objects}</annotation>"""
_OBJECT = """<object><name>{label}</name><bndbox><xmin>{0}</xmin><ymin>{1}</ymin>
<xmax>{2}</xmax><ymax>{3}</ymax></bndbox></object>"""


def _write(directory, stem, image_name, size, boxes, xml_size=None, image=True):
    """An XML with boxes [(label, xmin, ymin, xmax, ymax)] and (optionally) its image."""
    w, h = xml_size or size
    objects = ''.join(_OBJECT.format(*b[1:], label=b[0]) for b in boxes)
    (directory / (stem + '.xml')).write_text(
        _XML.format(name=image_name, w=w, h=h, objects=objects))
    if image:
        pixels = np.random.RandomState(0).randint(0, 255, (size[1], size[0], 3), np.uint8)
        Image.fromarray(pixels).save(str(directory / image_name))


def test_boxes_categories_and_ids_worked_by_hand(tmp_path):
    # a.png is 40 wide, 30 high. A box over the whole image (VOC 1..40, 1..30) is COCO
    # [0, 0, 40, 30]; a one-pixel box at VOC (5, 7) is [4, 6, 1, 1]; VOC x 10..19 (10 pixels),
    # y 3..4 (2 pixels) is [9, 2, 10, 2].
    _write(tmp_path, 'a', 'a.png', (40, 30),
           [('Tree', 1, 1, 40, 30), ('Dead', 5, 7, 5, 7)])
    _write(tmp_path, 'b', 'b.jpg', (20, 10), [('Tree', 10, 3, 19, 4)])
    out = tmp_path / 'out' / 'coco.json'
    coco = voc_to_coco.convert(str(tmp_path), str(out))
    assert json.loads(out.read_text()) == coco
    assert coco['categories'] == [{'id': 1, 'name': 'Dead'}, {'id': 2, 'name': 'Tree'}]
    assert coco['images'] == [{'id': 1, 'file_name': 'a.png', 'width': 40, 'height': 30},
                              {'id': 2, 'file_name': 'b.jpg', 'width': 20, 'height': 10}]
    got = [(a['image_id'], a['category_id'], a['bbox'], a['area']) for a in coco['annotations']]
    assert got == [(1, 2, [0, 0, 40, 30], 1200), (1, 1, [4, 6, 1, 1], 1),
                   (2, 2, [9, 2, 10, 2], 20)]
    assert [a['id'] for a in coco['annotations']] == [1, 2, 3]


def test_single_class_and_include(tmp_path):
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 4, 4), ('Dead', 5, 7, 5, 7)])
    _write(tmp_path, 'b', 'b.png', (20, 10), [('Alive', 10, 3, 19, 4)])
    coco = voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'), single_class='tree',
                               include=['b'])
    assert coco['categories'] == [{'id': 1, 'name': 'tree'}]
    assert [i['file_name'] for i in coco['images']] == ['b.png']
    assert [(a['category_id'], a['bbox']) for a in coco['annotations']] == [(1, [9, 2, 10, 2])]
    with pytest.raises(voc_to_coco.VocError, match='--include names c'):
        voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'), include=['c'])


@pytest.mark.parametrize('box, message', [
    (('Tree', 1, 1, 41, 30), 'outside the 40x30 image'),
    (('Tree', 0, 1, 4, 4), 'outside the 40x30 image'),
    (('Tree', 5, 1, 4, 4), 'max < min'),
])
def test_bad_box_names_the_xml(tmp_path, box, message):
    _write(tmp_path, 'a', 'a.png', (40, 30), [box])
    out = tmp_path / 'o.json'
    with pytest.raises(voc_to_coco.VocError, match=message) as error:
        voc_to_coco.convert(str(tmp_path), str(out))
    assert str(error.value).startswith(str(tmp_path / 'a.xml'))
    assert not out.exists()


def test_missing_image_size_mismatch_and_unparsable_xml(tmp_path):
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 4, 4)], image=False)
    with pytest.raises(voc_to_coco.VocError, match=r"a.xml: image 'a.png' is not in"):
        voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'))
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 4, 4)], xml_size=(40, 31))
    with pytest.raises(voc_to_coco.VocError, match='says 40x31 but .*a.png is 40x30'):
        voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'))
    image = Image.open(tmp_path / 'a.png')
    exif = image.getexif()
    exif[0x0112] = 6  # Rotated 90 degrees: the upright view is 30x40.
    image.save(tmp_path / 'a.png', exif=exif)
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 4, 4)], xml_size=(30, 40),
           image=False)
    with pytest.raises(voc_to_coco.VocError, match='the upright view of .*a.png .*EXIF '
                       'orientation 6.*save the photo upright'):
        voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'))
    (tmp_path / 'a.xml').write_text('<annotation><filename>a.png')
    with pytest.raises(voc_to_coco.VocError, match='a.xml: not readable as XML'):
        voc_to_coco.convert(str(tmp_path), str(tmp_path / 'o.json'))


def test_command_line_one_line_error_and_success(tmp_path):
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 41, 30)])
    command = [sys.executable, '-m', 'efficientdet_hpu.datatools.voc_to_coco',
               '--xml_dir=%s' % tmp_path, '--output_file=%s' % (tmp_path / 'o.json')]
    failed = run_process(command, timeout=120, stderr=subprocess.PIPE)
    assert failed.returncode == 2
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('voc_to_coco: error: %s' % (tmp_path / 'a.xml'))
    _write(tmp_path, 'a', 'a.png', (40, 30), [('Tree', 1, 1, 40, 30)])
    done = run_process(command + ['--single_class=tree'], timeout=120, env=dict(os.environ),
                       stderr=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert '1 images, 1 boxes, categories tree' in done.stdout
