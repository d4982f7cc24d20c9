"""Gradient accumulation inside one training step (`--gradient_accumulation_steps=K`).

Each rank's input batch holds K micro-batches of `train_batch_size` images. model_fn cuts it
(`split_micro_batches`), builds the network once per micro-batch (shared variables) and sums
the micro-batches' gradients (`sum_gradients`); the sum is then averaged over ranks once and
applied once. Everything is one graph run by one session.run: no host round trip per
micro-batch, so it is the same graph on CPU, GPU and HPU.

The micro-batches run one after another: micro-batch k+1's inputs wait (a control dependency)
until micro-batch k's gradients are added to the running sum and its batch-norm moving-average
updates are done, so only one micro-batch's activations are alive at a time, and the moving
averages are updated in micro-batch order (deterministic).
"""
import tensorflow as tf

tf1 = tf.compat.v1


def split_micro_batches(tensors, num_micro_batches):
    """Cuts every tensor of a nested structure into `num_micro_batches` along axis 0.

    Args:
      tensors: a nest (dicts, tuples) of tensors with the same static leading size K x b,
        e.g. (images float32 [K*b, H, W, 3], labels {name: [K*b, ...]}).
      num_micro_batches: K, a positive int.
    Returns: a list of K nests of the same structure, micro-batch k holding rows k*b..(k+1)*b-1.
    Raises ValueError when a leading size is unknown or not a multiple of K.
    """
    if num_micro_batches == 1:
        return [tensors]
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]
    for tensor in flat:
        rows = tensor.shape[0] if tensor.shape.rank else None
        if rows is None or rows % num_micro_batches:
            raise ValueError('cannot cut %s (shape %s) into %d micro-batches: the leading size '
                             'must be static and a multiple of %d'
                             % (tensor.name, tensor.shape, num_micro_batches, num_micro_batches))
    pieces = [tf.split(tensor, num_micro_batches, axis=0) for tensor in flat]
    return [tf.nest.pack_sequence_as(tensors, [piece[k] for piece in pieces])
            for k in range(num_micro_batches)]


def sum_gradients(first_loss, later_micro_batches, build_loss, variables, scale_loss=None):
    """Gradients of first_loss plus the losses of later micro-batches, one after the other.

    Args:
      first_loss: float32 scalar, the first micro-batch's loss, already built (so its
        network's variables exist before the caller creates optimizer state).
      later_micro_batches: the other micro-batches (nests of tensors, split_micro_batches).
      build_loss: f(micro-batch) -> its float32 scalar loss (builds its network). It gets the
        micro-batch through identities that wait (a control dependency) for the previous
        micro-batch's summed gradients and batch-norm updates (UPDATE_OPS added since). Only
        those identities carry the dependency: a control input on every op would stop
        Grappler's fusions (convolution + bias + activation) in the later networks.
      variables: the variables to differentiate with respect to.
      scale_loss: None or f(loss) -> loss times the float16 loss scale; the gradients are then
        those of the scaled losses, summed before any unscaling. An overflow (inf/NaN) in any
        micro-batch makes the sum non-finite (inf + x = inf, inf - inf = NaN), so one finite
        check on the sum skips the whole step.
    Returns: (the summed loss, a list of summed gradients in `variables` order; None where no
      loss depends on the variable).
    """
    scale_loss = scale_loss or (lambda loss: loss)
    seen_updates = set()
    total, summed = first_loss, _gradients(scale_loss(first_loss), variables)
    for micro_batch in later_micro_batches:
        with tf.control_dependencies([_after(summed, _new_update_ops(seen_updates))]):
            micro_batch = tf.nest.map_structure(tf.identity, micro_batch)
        loss = build_loss(micro_batch)
        total = total + loss
        summed = [_add(a, b) for a, b in zip(summed, _gradients(scale_loss(loss), variables))]
    return total, summed


def _gradients(loss, variables):
    gradients = tf1.gradients(loss, variables)
    return [g if g is None else tf.convert_to_tensor(g) for g in gradients]  # Dense slices.


def _add(a, b):
    if a is None or b is None:
        return b if a is None else a
    return a + b


def _new_update_ops(seen):
    """UPDATE_OPS not returned before (the micro-batch just built), remembered in `seen`."""
    new = [op for op in tf1.get_collection(tf1.GraphKeys.UPDATE_OPS) if op not in seen]
    seen.update(new)
    return new


def _after(gradients, update_ops):
    """One op that runs once the gradients and the updates are done: the next micro-batch's
    gate (one control edge per op instead of one per gradient)."""
    return tf.group(*([g for g in gradients if g is not None] + list(update_ops)),
                    name='micro_batch_done')
