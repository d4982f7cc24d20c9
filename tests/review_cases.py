"""Data for the review tests (tests/review/): small COCO, Pascal VOC and YOLO folders of real
photos (PIL, three squares of two colours each), and a review of one without TensorFlow: the
real data stage, folds, links and last stage (scores, issues.csv, the page, the exports), with
each fold's detections.json written here instead of by a trained model. The detections find
every label, except that photo 1's first box is seen as the other class (a swap), photo 2's
second box is seen shifted to IoU 0.4 (a bad location), and photo 3 holds an object nobody
labelled (overlooked)."""
import io
import json
import os

from PIL import Image, ImageDraw

from efficientdet_hpu.finetune import plan as finetune_plan
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import runner as runner_lib
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.review import layout as layout_lib
from efficientdet_hpu.review import plan as plan_lib
from efficientdet_hpu.review import predictions
from efficientdet_hpu.review import report
from finetune_cases import ROOMY

SIZE = (160, 120)
SIDE = 31
COLOURS = ((200, 40, 40), (40, 40, 200))
NAMES = ('red', 'blue')
PHOTOS = 6
OVERLOOKED_BOX = [120, 80, 150, 110]  # x1, y1, x2, y2: the unlabelled object of photo 3.


def squares(index):
    """[(x, y, w, h, class index)] of photo `index`."""
    return [(10 + (SIDE + 14) * j, 15 + (7 * index) % 40, SIDE, SIDE, j % 2) for j in range(3)]


def _photo(path, index):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = Image.new('RGB', SIZE, (90, 120, 60))
    draw = ImageDraw.Draw(image)
    for x, y, w, h, label in squares(index):
        draw.rectangle([x, y, x + w - 1, y + h - 1], fill=COLOURS[label])
    if index == 3:
        draw.rectangle(OVERLOOKED_BOX, fill=COLOURS[1])
    image.save(path)


def make_coco(folder, photos=PHOTOS):
    images, annotations = [], []
    for i in range(photos):
        _photo(os.path.join(folder, 'photo%d.jpg' % i), i)
        images.append({'id': 100 + i, 'file_name': 'photo%d.jpg' % i, 'width': SIZE[0],
                       'height': SIZE[1]})
        for x, y, w, h, label in squares(i):
            annotations.append({'id': 500 + len(annotations), 'image_id': 100 + i,
                                'category_id': 3 + label, 'bbox': [x, y, w, h],
                                'area': w * h, 'iscrowd': 0})
    with open(os.path.join(folder, 'instances.json'), 'w') as stream:
        json.dump({'images': images, 'annotations': annotations,
                   'categories': [{'id': 3, 'name': 'red'}, {'id': 4, 'name': 'blue'}]}, stream)
    return folder


def make_voc(folder):
    for i in range(PHOTOS):
        _photo(os.path.join(folder, 'v%d.png' % i), i)
        objects = ''.join(
            '<object><name>%s</name><bndbox><xmin>%d</xmin><ymin>%d</ymin><xmax>%d</xmax>'
            '<ymax>%d</ymax></bndbox></object>' % (NAMES[label], x + 1, y + 1, x + w, y + h)
            for x, y, w, h, label in squares(i))
        with open(os.path.join(folder, 'v%d.xml' % i), 'w') as stream:
            stream.write('<annotation><filename>v%d.png</filename><size><width>%d</width>'
                         '<height>%d</height></size>%s</annotation>' % (i, SIZE[0], SIZE[1],
                                                                        objects))
    return folder


def make_yolo(folder):
    os.makedirs(os.path.join(folder, 'labels'), exist_ok=True)
    for i in range(PHOTOS):
        _photo(os.path.join(folder, 'images', 'y%d.jpg' % i), i)
        with open(os.path.join(folder, 'labels', 'y%d.txt' % i), 'w') as stream:
            stream.write('\n'.join('%d %.6f %.6f %.6f %.6f' % (
                label, (x + w / 2) / SIZE[0], (y + h / 2) / SIZE[1], w / SIZE[0], h / SIZE[1])
                for x, y, w, h, label in squares(i)) + '\n')
    with open(os.path.join(folder, 'classes.txt'), 'w') as stream:
        stream.write('red\nblue\n')
    return folder


def _detections(coco, category_ids, blue):
    """The detections of a fold's photos (see the module docstring), scores 0.80-0.99."""
    rows = []
    by_image = {image['id']: [] for image in coco['images']}
    for annotation in coco['annotations']:
        by_image[annotation['image_id']].append(annotation)
    for image in coco['images']:
        index = int(''.join(ch for ch in os.path.splitext(image['file_name'])[0]
                            if ch.isdigit()))
        for k, annotation in enumerate(by_image[image['id']]):
            category, (x, y, w, h) = annotation['category_id'], annotation['bbox']
            score = 0.8 + 0.03 * ((index + k) % 7)
            if index == 1 and k == 0:
                category, score = next(c for c in category_ids if c != category), 0.97
            if index == 2 and k == 1:
                x += w * 3 / 7.0  # IoU (4/7) / (10/7) = 0.4 with the label.
            rows.append({'file_name': image['review_name'], 'category_id': category,
                         'bbox': [x, y, w, h], 'score': score})
        if index == 3:
            x1, y1, x2, y2 = OVERLOOKED_BOX
            rows.append({'file_name': image['review_name'], 'category_id': blue,
                         'bbox': [x1, y1, x2 - x1, y2 - y1], 'score': 0.97})
    return rows


def fake_review(folder, output_dir, folds=2, val_folder=None):
    """Runs the review's real stages but training and prediction on `folder` (and
    `val_folder` as --val_data); returns (summary, review Layout, fine-tune Layout, what the
    runner said)."""
    stream = io.StringIO()
    runner = runner_lib.Runner(runner_lib.Layout(output_dir), stream=stream)
    record = prepare.data_stage(runner, prepare.Options(data=folder, val_data=val_folder or '',
                                                        output_dir=output_dir))
    with open(runner.layout.train_json) as one, open(runner.layout.val_json) as two:
        train, val = json.load(one), json.load(two)
    plan = finetune_plan.make_plan(stats.from_coco(train, val), ROOMY, finetune_plan.Request())
    review = plan_lib.make(plan, train, val, plan_lib.Request(folds=folds))
    layout = layout_lib.Layout(output_dir)
    category_ids = sorted(c['id'] for c in train['categories'])
    blue = next(c['id'] for c in train['categories'] if c['name'] == 'blue')
    for fold in review.folds:
        coco = predictions.fold_coco(fold, train, val)
        predictions.write_inputs(layout, fold, coco, {'train': record['train_image_dir'],
                                                      'val': record['val_image_dir']})
        with open(layout.fold(fold.index, 'photos.json')) as stream_:
            linked = json.load(stream_)
        os.makedirs(layout.fold(fold.index, 'predictions'))
        with open(layout.fold(fold.index, 'predictions', 'detections.json'), 'w') as out:
            json.dump(_detections(linked, category_ids, blue), out)
    summary = report.finish(runner, layout, review, record, 0.5, False)
    return summary, layout, runner.layout, stream.getvalue()
