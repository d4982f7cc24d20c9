"""Freezing variables by name, as google/automl's `var_freeze_expr` does.

automl's TF1 det_model_fn passes the trainable variables through `freeze_vars`: a variable whose
name matches the expression with `re.match` (anchored at the start of the name, not at its end)
is left out of the optimizer's variable list, so it gets no gradient, no momentum and no update.
Its batch-norm moving statistics are not trainable variables and keep updating, as in automl.
automl's fine-tuning recipes use `(efficientnet|fpn_cells|resample_p6)` (backbone and BiFPN
frozen, heads trained); `efficientnet` alone freezes the backbone (docs/training.md).
"""
import re

from absl import logging

from efficientdet_hpu.core.cli import UserError


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


def trainable(variables, expression):
    """`variables` without those whose name re.match-es `expression` (empty: all kept).

    variables: tf.Variable objects (names such as 'efficientnet-lite0/stem/conv2d/kernel:0')."""
    pattern = compile_expression(expression)
    if pattern is None:
        return list(variables)
    kept = [v for v in variables if not pattern.match(v.name)]
    if variables and not kept:
        raise FreezeError('var_freeze_expr=%r matches all %d trainable variables, so nothing '
                          'would train; narrow it (e.g. efficientnet for the backbone only)'
                          % (expression, len(variables)))
    logging.info('var_freeze_expr=%r: %d of %d trainable variables frozen', expression,
                 len(variables) - len(kept), len(variables))
    return kept
