"""Your labels, reviewed (`efficientdet-review`, `efficientdet-finetune --review_labels`): K
models, each trained on all labelled photos but one fold, predict the photos they never saw;
cleanlab's object-detection scores (ObjectLab) rank every label and photo; the issues come
back as a table, a page and the labelling tools' files. docs/review.md.

  folds        the photos in K folds, whole, fold 0 the fine-tune's validation
  plan         the folds, each fold's steps and the time, from the fine-tune's plan and a budget
  layout       the review's files under output_dir/review/
  predictions  each fold converted, its model trained, its photos predicted (the project's
               own commands, as the fine-tune runs them)
  scores       the adapter to cleanlab: its formats in, its scores out (no scoring of its own)
  issues       the ranked issues and issues.csv
  page         the HTML page with the crops
  exports      the COCO JSON with a review field per label, FiftyOne's dataset or files
  impact       the share of a fine-tune's validation AP the suspected labels could explain
  report       the last stage: scores to files, summary.json and the table
  run          the review from start to end, for the command and for the fine-tune
  planted      errors planted in a clean set, and how many of them the review finds
"""
