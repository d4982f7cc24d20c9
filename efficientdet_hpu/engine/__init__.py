"""The training engine: what runs the model_fn of training/ over a model_dir. A run's set-up
(setup), the mode loops (loops), session hooks (hooks), the distributed evaluation of
checkpoints (checkpoint_eval), stop signals (preemption), model_dir/.lock (model_dir_lock), the
JSON training log and memory CSV (train_log), early stopping (early_stop), the resume and
anchor coverage checks at start (resume_check, coverage_check), bad records met while reading
(bad_records) and `main.py --benchmark` (throughput)."""
