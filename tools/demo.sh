#!/usr/bin/env bash
# make demo: generate the embedded synthetic dataset, convert it, train from scratch with
# configs/demo.yaml, evaluate, print the COCO table. Re-running resumes where it stopped.
# SIGTERM, SIGINT or SIGHUP stop it cleanly (tools/stop_signals.sh): training writes the
# checkpoint of the step it is at, and `make demo` continues from it. PY (default:
# $VENV/bin/python, VENV default .venv) is the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-${VENV:-.venv}/bin/python}
DATA_DIR=${DATA_DIR:-data/synthetic}
DEMO_DIR=${DEMO_DIR:-runs/demo}
RECORDS=$DATA_DIR/tfrecords
STOP_KEPT="the data and $DEMO_DIR's checkpoints are kept; make demo continues from them"
# shellcheck source=tools/stop_signals.sh
source tools/stop_signals.sh

if [ ! -f "$DATA_DIR/annotations/instances_val.json" ]; then
  step "$PY" -m dataset.synthetic_coco --output_dir "$DATA_DIR" --num_train 800 --num_val 100 \
    --seed 0
fi
for split in train val; do
  if [ ! -f "$RECORDS/$split-label_map.json" ]; then
    step "$PY" -m dataset.create_coco_tfrecord --image_dir "$DATA_DIR/$split" \
      --object_annotations_file "$DATA_DIR/annotations/instances_$split.json" \
      --output_file_prefix "$RECORDS/$split" --num_shards 4
  fi
done
step "$PY" main.py --hparams=configs/demo.yaml \
  --training_file_pattern="$RECORDS/train-*.tfrecord" \
  --validation_file_pattern="$RECORDS/val-*.tfrecord" \
  --val_json_file="$DATA_DIR/annotations/instances_val.json" \
  --model_dir="$DEMO_DIR" "$@"
