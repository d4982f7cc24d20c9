"""The data tools under the names Habana's and automl's users type: `python -m
dataset.create_coco_tfrecord`, `dataset.verify_tfrecords`, `dataset.doctor` and
`dataset.synthetic_coco`. The code is efficientdet_hpu.datatools; the record format and the
input pipeline are efficientdet_hpu.data."""
