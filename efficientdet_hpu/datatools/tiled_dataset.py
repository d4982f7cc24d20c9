"""Tiles as a dataset: `create_coco_tfrecord --tile_size` cuts each photo of a split into
overlapping tiles (data/tiling.py: geometry and the sliver rule) and writes, beside the shards,
`<prefix>-tiles.json`, the tiles as a COCO instances JSON for evaluating on tiles.

Split by photo, then tile: convert each split's own annotation file. Overlapping tiles of one
photo in both train and val would leak the val objects into training.
"""
from efficientdet_hpu.data import tiling
from efficientdet_hpu.data.coco_annotations import ConversionError


TILES_JSON_SUFFIX = '-tiles.json'


def tile_records(records: list, tile_size: int, overlap: int, min_visible: float):
    """Every image cut into tiles (data/tiling.py; ids 1..T); returns (tiles, summary part).
    Tile each split's own images: tiles of one photo in two splits would leak."""
    if not overlap < tile_size or not 0 < min_visible <= 1:
        raise ConversionError(f'need --tile_overlap < --tile_size and 0 < --tile_min_visible '
                              f'<= 1, got {overlap}, {tile_size}, {min_visible}.')
    tiles, in_no_tile = [], 0
    for record in records:
        parts, lost = tiling.split_record(record, tile_size, overlap, min_visible,
                                          first_id=len(tiles) + 1)
        tiles += parts
        in_no_tile += lost
    return tiles, {'tile_size': tile_size, 'overlap': overlap, 'min_visible': min_visible,
                   'photos': len(records), 'tiles': len(tiles), 'boxes_in_no_tile': in_no_tile}


def coco_json(records: list, categories: list, label_map) -> dict:
    """The written tiles as a COCO instances JSON (--val_json_file for evaluating tiles);
    each image keeps its photo's id and origin under 'tile'. label_map: a label_map.LabelMap."""
    to_category = label_map.label_to_category_id
    images, annotations = [], []
    for record in records:
        images.append({'id': record.image_id, 'file_name': record.file_name,
                       'width': record.width, 'height': record.height,
                       'tile': {'source_id': record.source_id, 'origin_y': record.tile[0],
                                'origin_x': record.tile[1]}})
        for box, label, crowd, area in zip(record.boxes, record.labels, record.is_crowd,
                                           record.areas):
            ymin, xmin = box[0] * record.height, box[1] * record.width
            ymax, xmax = box[2] * record.height, box[3] * record.width
            annotations.append({'id': len(annotations) + 1, 'image_id': record.image_id,
                                'category_id': to_category[label], 'iscrowd': crowd,
                                'bbox': [xmin, ymin, xmax - xmin, ymax - ymin], 'area': area})
    return {'images': images, 'annotations': annotations, 'categories': categories}
