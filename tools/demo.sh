#!/usr/bin/env bash
# make demo: generate the embedded synthetic dataset, convert it, train from scratch with
# configs/demo.yaml, evaluate, print the COCO table. Re-running resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DATA_DIR=${DATA_DIR:-data/synthetic}
DEMO_DIR=${DEMO_DIR:-runs/demo}
RECORDS=$DATA_DIR/tfrecords

if [ ! -f "$DATA_DIR/annotations/instances_val.json" ]; then
  "$PY" -m dataset.synthetic_coco --output_dir "$DATA_DIR" --num_train 800 --num_val 100 --seed 0
fi
for split in train val; do
  if [ ! -f "$RECORDS/$split-label_map.json" ]; then
    "$PY" -m dataset.create_coco_tfrecord --image_dir "$DATA_DIR/$split" \
      --object_annotations_file "$DATA_DIR/annotations/instances_$split.json" \
      --output_file_prefix "$RECORDS/$split" --num_shards 4
  fi
done
exec "$PY" main.py --hparams=configs/demo.yaml \
  --training_file_pattern="$RECORDS/train-*.tfrecord" \
  --validation_file_pattern="$RECORDS/val-*.tfrecord" \
  --val_json_file="$DATA_DIR/annotations/instances_val.json" \
  --model_dir="$DEMO_DIR" "$@"
