"""Only the command spelling `python -m training.plot_curves` (the training code is
efficientdet_hpu.training)."""
