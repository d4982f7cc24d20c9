"""One-command fine-tuning (`efficientdet-finetune`, issue 33): a folder of photos and their
annotations (COCO, Pascal VOC or YOLO) in, a plan sized to the data, the machine and the time
budget, then the project's own commands run under deadlines: convert, doctor, train, evaluate
the whole photos, export. docs/finetune.md.

  inputs     what --data holds (format, photos, classes) and the split by photo
  stats      the photos' sizes and boxes the plan is made from, what tiling them gives
  costs      the measured speeds, memory and stage times the estimates use
  plan       the decisions and their reasons (pure: no TensorFlow, no files)
  plan_file  the plan as main.py's recipe (plan.yaml) and as printed lines
  hardware   the machine: cores, available memory, accelerators
  weights    what --weights names: an ImageNet backbone or a whole detector
  runner     the output_dir's layout; the project's commands as children under deadlines
  prepare    stages 1-2: the data read, checked and split; the data doctor; the plan
  stages     stages 3-6: records, training (stopped at the budget), evaluation, export
  report     the picture, the summary table and summary.json
"""
