"""Command-line tools over the data library: the COCO converter, the TFRecord verifier, the
data doctor and the synthetic demo data set."""
