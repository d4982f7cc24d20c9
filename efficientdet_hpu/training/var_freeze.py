"""Freezing variables by name, as google/automl's `var_freeze_expr` does.

automl's TF1 det_model_fn passes the trainable variables through `freeze_vars`: a variable whose
name matches the expression with `re.match` (anchored at the start of the name, not at its end)
is left out of the optimizer's variable list, so it gets no gradient, no momentum and no update.
Its batch-norm moving statistics are not trainable variables and keep updating, as in automl.
automl's fine-tuning recipes use `(efficientnet|fpn_cells|resample_p6)` (backbone and BiFPN
frozen, heads trained); `efficientnet` alone freezes the backbone (docs/training.md).

A freeze for the first phase only (keys `var_freeze_steps` N > 0 and
`var_freeze_lr_multiplier` m, this project's; 0 keeps automl's whole-run freeze): the matched
variables stay in the optimizer's list, their gradients are zero before step N (before the
gradient norm and clipping, so the other variables see exactly the frozen run's step: with
zero gradients from a zero state, momentum, Adam's moments and the weight-decay term move
nothing) and from step N on they are scaled by m after clipping, i.e. they train at m times
the learning rate. One run does what otherwise takes two (freeze, then --ckpt with its own
learning rate).
"""
import re

import tensorflow as tf
from absl import logging

from efficientdet_hpu.core.errors import UserError


class FreezeError(UserError):
    """var_freeze_expr is not a usable regular expression or freezes every variable."""


def compile_expression(expression):
    """The compiled expression, or None when it is empty; FreezeError names a bad one."""
    if not expression:
        return None
    try:
        return re.compile(expression)
    except re.error as error:
        raise FreezeError('var_freeze_expr=%r is not a regular expression (%s); fix it in the '
                          'recipe or --hparams' % (expression, error)) from None


def check_schedule(expression, steps, multiplier, optimizer='sgd'):
    """FreezeError when the phase keys are set without an expression or out of range."""
    if steps < 0 or multiplier < 0:
        raise FreezeError('var_freeze_steps=%s and var_freeze_lr_multiplier=%s must be >= 0'
                          % (steps, multiplier))
    if not expression and (steps or multiplier != 1.0):
        raise FreezeError('var_freeze_steps / var_freeze_lr_multiplier need var_freeze_expr '
                          '(the variables they apply to, e.g. var_freeze_expr=efficientnet)')
    if not steps and multiplier != 1.0:
        raise FreezeError('var_freeze_lr_multiplier=%s applies once the freeze ends: set '
                          'var_freeze_steps=N (0 freezes the whole run, as automl)' % multiplier)
    if multiplier != 1.0 and optimizer != 'sgd':
        # Scaling a gradient scales SGD's step; Adam divides it out again.
        raise FreezeError('var_freeze_lr_multiplier=%s needs optimizer sgd (Adam normalises '
                          'the gradient, so the multiplier would change nothing); leave it 1 '
                          'with optimizer %s' % (multiplier, optimizer))


def _matched(variables, expression, during):
    """[bool] per variable: its name re.match-es `expression`; FreezeError when all do."""
    pattern = compile_expression(expression)
    flags = [bool(pattern and pattern.match(v.name)) for v in variables]
    if variables and all(flags):
        raise FreezeError('var_freeze_expr=%r matches all %d trainable variables, so nothing '
                          'would train%s; narrow it (e.g. efficientnet for the backbone only)'
                          % (expression, len(variables), during))
    return flags


def phased(variables, expression, steps):
    """[bool] per variable: in the freeze phase (matched) when var_freeze_steps > 0; these
    stay in the optimizer's list (see the module docstring)."""
    flags = _matched(variables, expression, ' in the first %d steps' % steps)
    logging.info('var_freeze_expr=%r: %d of %d trainable variables frozen until step %d',
                 expression, sum(flags), len(variables), steps)
    return flags


def zero_until(grads, flags, steps, global_step):
    """Gradients of the flagged variables times 0 before step `steps`, else unchanged."""
    thawed = tf.cast(global_step >= steps, tf.float32)
    return [g * tf.cast(thawed, g.dtype) if flag else g for g, flag in zip(grads, flags)]


def scale(grads, flags, multiplier):
    """Gradients of the flagged variables times `multiplier` (their learning rate's)."""
    if multiplier == 1.0:
        return list(grads)
    return [g * tf.cast(multiplier, g.dtype) if flag else g for g, flag in zip(grads, flags)]


def trainable(variables, expression):
    """`variables` without those whose name re.match-es `expression` (empty: all kept).

    variables: tf.Variable objects (names such as 'efficientnet-lite0/stem/conv2d/kernel:0')."""
    if compile_expression(expression) is None:
        return list(variables)
    flags = _matched(variables, expression, '')
    kept = [v for v, frozen in zip(variables, flags) if not frozen]
    logging.info('var_freeze_expr=%r: %d of %d trainable variables frozen', expression,
                 len(variables) - len(kept), len(variables))
    return kept
