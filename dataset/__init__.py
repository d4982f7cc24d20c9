"""Dataset tools: TFRecord schema, label maps, COCO conversion and the synthetic demo set."""
