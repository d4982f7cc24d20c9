"""Gradient clipping as google/automl's Estimator model_fn does it (`clip_gradients_norm`).

automl first clips each variable's gradient to the norm on its own (tf.clip_by_norm), then
the whole list to the same global norm (tf.clip_by_global_norm), and logs the global norm of
what is finally applied. Plain functions over lists of tensors: no config, no Horovod.
"""
import tensorflow as tf


def clip_gradients(grads, clip_norm, *, per_variable=True, global_norm=None):
    """Clips a list of gradients.

    Args:
      grads: list of float32 tensors (any shapes), one per variable; None entries stay None.
      clip_norm: positive float; <= 0 returns the gradients unchanged.
      per_variable: True: each gradient to clip_norm first, then globally (automl);
        False: only the global norm.
      global_norm: float32 scalar, the global norm of `grads` if already computed.

    Returns:
      (clipped list, float32 scalar global norm of the clipped list): the second is the
      gradient norm automl logs (`gradient_norm`).
    """
    if global_norm is None:
        global_norm = tf.linalg.global_norm(grads)
    if clip_norm <= 0:
        return list(grads), global_norm
    if per_variable:
        grads = [None if g is None else tf.clip_by_norm(g, clip_norm) for g in grads]
        global_norm = tf.linalg.global_norm(grads)
    clipped, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=global_norm)
    return clipped, tf.linalg.global_norm(clipped)
