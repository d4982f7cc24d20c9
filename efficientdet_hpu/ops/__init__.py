"""Pure numeric code: box coding and IoU, anchors and target assignment, losses, in-graph and
NumPy post-processing, graph-mode layers. Plain functions over tensors: no config object, no
flags, no Horovod."""
