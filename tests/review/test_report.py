"""review/report.py: the summary table's warning on weak fold models, at the measured line."""
from efficientdet_hpu.review import report


def _summary(matched, labels=100):
    return {'photos': 10, 'labels': labels, 'folds': 3, 'matched_labels': matched,
            'suspected': {'overlooked': 1, 'swap': 2, 'badloc': 3, 'image': 4},
            'threshold': 0.6, 'minutes': 1.0, 'planned_minutes': 1.0, 'page': 'index.html',
            'issues_csv': 'issues.csv', 'coco_json': 'review_coco.json', 'fiftyone_line': '-'}


def _fold_models(summary):
    return next(line.split('fold models', 1)[1].strip() for line in report.table(summary)
                if line.strip().startswith('fold models'))


def test_fold_models_finding_fewer_than_four_labels_in_five_are_said_to_be_too_weak():
    weak = _fold_models(_summary(62))
    assert weak.startswith('find 62% of the labels (same class, IoU >= 0.5): too few')
    assert '--steps' in weak and '--weights' in weak
    assert _fold_models(_summary(80)) == (
        'find 80% of the labels (same class, IoU >= 0.5)')


def test_a_run_that_went_on_from_a_stopped_one_says_its_minutes_are_its_own():
    """A review stopped and run again: the run's minutes are the last piece's, the plan's the
    whole review's; the row says so rather than read as a review 3 times faster than planned."""
    def time_row(summary):
        return next(line.split('time', 1)[1].strip() for line in report.table(summary)
                    if line.strip().startswith('time'))
    summary = dict(_summary(90), minutes=56.9, planned_minutes=168.0)
    assert time_row(summary) == '56.9 min (planned 168.0)'
    assert time_row(dict(summary, went_on=True)) == (
        '56.9 min this run, which went on from a stopped one (planned 168.0 for the whole '
        'review)')
