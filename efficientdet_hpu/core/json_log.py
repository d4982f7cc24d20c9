"""main.py's JSON log in model_dir, one object a line (engine/train_log.py writes it), read
without TensorFlow, so that the fine-tune, which watches it while main.py runs, imports none.
Lines are appended, so a crash, or a read while a line is written, can at worst find the last
line cut short: it is skipped."""
import json
import os

JSON_LOG = 'train_log.jsonl'


def read(model_dir):
    """The records of model_dir's JSON log ([] when there is none), a torn line skipped."""
    records = []
    try:
        with open(os.path.join(model_dir, JSON_LOG), encoding='utf-8') as stream:
            for line in stream:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return records
