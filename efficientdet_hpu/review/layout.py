"""Where the review keeps its files: under output_dir/review/ of a fine-tune's layout
(finetune/runner.py), whose data/ (train.json, val.json, records/val-*) and plan it reuses.

  review/request.json              the flags that decide the review (a rerun must match)
  review/plan.json                 the folds, the steps, the time
  review/records/fold-K-*          the converter's shards of fold K's photos (tiles)
  review/folds/fold-K/             photos.json (fold K's COCO), photos/ (links), train.yaml,
                                   model/ (main.py), training.json, predictions/ (inference.py)
  review/predictions.json          every fold's detections, by photo
  review/scores.json               cleanlab's scores of every label, prediction and photo
  review/issues.csv                the ranked issues
  review/index.html, crops/        the page
  review/review_coco.json          the labels with a `review` field (CVAT, Label Studio)
  review/fiftyone/                 the FiftyOne files (or dataset)
  review/summary.json              the counts and paths (written last: the review is done)
"""
import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Layout:
    """Paths of the review under `root` (the fine-tune's or the review's --output_dir)."""
    root: str

    def path(self, *parts) -> str:
        return os.path.join(self.root, 'review', *parts)

    directory = property(lambda self: self.path())
    request_json = property(lambda self: self.path('request.json'))
    plan_json = property(lambda self: self.path('plan.json'))
    records = property(lambda self: self.path('records'))
    predictions_json = property(lambda self: self.path('predictions.json'))
    scores_json = property(lambda self: self.path('scores.json'))
    issues_csv = property(lambda self: self.path('issues.csv'))
    page = property(lambda self: self.path('index.html'))
    crops = property(lambda self: self.path('crops'))
    coco_json = property(lambda self: self.path('review_coco.json'))
    fiftyone = property(lambda self: self.path('fiftyone'))
    summary_json = property(lambda self: self.path('summary.json'))

    def fold(self, index, *parts) -> str:
        return self.path('folds', 'fold-%d' % index, *parts)

    def fold_records(self, index) -> str:
        """The converter's --output_file_prefix of fold `index`."""
        return os.path.join(self.records, 'fold-%d' % index)
