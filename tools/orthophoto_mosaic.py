"""A large annotated photo built from a small one, for measuring tiled prediction at scale.

    python tools/orthophoto_mosaic.py --annotations_file=data/trees/val.json \
        --image_dir=PHOTOS --columns=8 --rows=10 --output_dir=data/trees/mosaic

repeats the file's first photo `columns` x `rows` times (8 x 10 of the 1249 x 1035 YELL photo:
9992 x 10350 pixels, 22,320 trees) and writes the PNG and its COCO JSON (every box moved with
its copy). tools/trees.sh's `mosaic` step runs it and predicts the mosaic tile by tile: the
scores should match the single photo's, and the run's peak memory is the photo plus one batch.
"""
import argparse
import json
import os

import numpy as np
from PIL import Image


def mosaic(annotations, pixels, columns, rows, file_name):
    """(uint8 [rows x H, columns x W, 3], COCO dict) of `pixels` repeated on a grid."""
    height, width = pixels.shape[:2]
    boxes = [a for a in annotations['annotations'] if not a.get('iscrowd', 0)]
    out = []
    for row in range(rows):
        for column in range(columns):
            for box in boxes:
                x, y, w, h = box['bbox']
                out.append(dict(box, id=len(out) + 1, image_id=1,
                                bbox=[x + column * width, y + row * height, w, h]))
    coco = {'images': [{'id': 1, 'file_name': file_name, 'width': width * columns,
                        'height': height * rows}],
            'annotations': out, 'categories': annotations['categories']}
    return np.tile(pixels, (rows, columns, 1)), coco


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--annotations_file', required=True)
    parser.add_argument('--image_dir', required=True)
    parser.add_argument('--columns', type=int, default=8)
    parser.add_argument('--rows', type=int, default=10)
    parser.add_argument('--output_dir', required=True)
    args = parser.parse_args()
    with open(args.annotations_file) as f:
        annotations = json.load(f)
    image = annotations['images'][0]
    annotations['annotations'] = [a for a in annotations['annotations']
                                  if a['image_id'] == image['id']]
    with Image.open(os.path.join(args.image_dir, image['file_name'])) as photo:
        pixels = np.asarray(photo.convert('RGB'))
    name = 'mosaic-%dx%d-%s' % (args.columns, args.rows,
                                os.path.splitext(os.path.basename(image['file_name']))[0] + '.png')
    big, coco = mosaic(annotations, pixels, args.columns, args.rows, name)
    os.makedirs(args.output_dir, exist_ok=True)
    Image.fromarray(big).save(os.path.join(args.output_dir, name))
    with open(os.path.join(args.output_dir, 'mosaic.json'), 'w') as f:
        json.dump(coco, f)
    print('wrote %s (%d x %d, %d boxes) and mosaic.json in %s' % (
        name, big.shape[1], big.shape[0], len(coco['annotations']), args.output_dir))


if __name__ == '__main__':
    main()
