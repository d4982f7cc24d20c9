"""COCO scoring, whoever drives the predictions: the evaluation metric (coco_metric), whole
photos with tens of thousands of boxes (photo_eval over sparse_coco), and what evaluation adds
around a score (eval_analysis: the split check, detections.json, the error analysis). The
drivers that run an Estimator or a predictor stay in their layers (docs/architecture.md)."""
