"""Model ops: plain functions and layers over tensors (box coding and IoU, layers, the BiFPN
topology as data, losses, in-graph and NumPy post-processing). No flags, no config object,
no Horovod: factories (efficientdet_arch, det_model_fn) read the config and pass arguments."""
