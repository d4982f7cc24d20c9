"""The anchor coverage check at the start of a training run: one warning line per class whose
boxes mostly miss the recipe's anchors, pointing to the data doctor (`python -m dataset.doctor`).
NumPy on the annotations only, with the doctor's own geometry (data/anchor_coverage.py)."""
import numpy as np

from efficientdet_hpu.data import anchor_coverage
from efficientdet_hpu.data import annotated_boxes


def low_coverage_warnings(config, annotations_json_path=None, *, file_pattern=None,
                          hparams=None):
    """One line per class whose anchor coverage is under 50%, for main.py to print at start.

    NumPy on the annotations only, on up to SEARCH_BOXES_PER_CLASS boxes per class (well under
    a second on the synthetic set; COCO's time is mostly reading its JSON). No advice
    search. Give the COCO JSON or the TFRecord pattern; hparams (the --hparams text) only
    goes into the suggested doctor command.

    Returns:
      list of str, empty when every class is covered.
    """
    box_set = annotated_boxes.load_boxes(annotations_json_path, file_pattern)
    sample = anchor_coverage.search_sample(box_set)
    setup = anchor_coverage.AnchorSetup.from_config(config)
    coverage = anchor_coverage.coverage_by_class(sample, setup)
    source = ('--annotations=%s' % annotations_json_path if annotations_json_path
              else "--file_pattern='%s'" % file_pattern)
    command = 'python -m dataset.doctor %s%s' % (source, ' --hparams=%s' % hparams
                                                  if hparams else '')
    counts = np.bincount(box_set.class_index, minlength=box_set.num_classes)
    return ['anchor coverage: only %.0f%% of the %d boxes of class %r reach IoU %g with an '
            'anchor (aspect_ratios %s, anchor_scale %g), so training gives the rest no positive '
            'anchor besides the forced match; for advice run: %s' % (
                100 * value, counts[index], box_set.class_names[index], setup.match_threshold,
                setup.overrides()['aspect_ratios'], setup.anchor_scale, command)
            for index, value in enumerate(coverage)
            if not np.isnan(value) and value < anchor_coverage.WEAK_COVERAGE]
