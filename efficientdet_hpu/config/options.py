"""What a run was asked to do: main.py's flag values as a plain, read-only object.

Library code takes a RunOptions, never the absl FLAGS object, so it can be driven from a test
or another program; main.py is the only place that reads flags.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class RunOptions:
    mode: str
    model_name: str
    model_dir: str
    hparams: str
    backbone_ckpt: str
    ckpt: str
    train_batch_size: int
    gradient_accumulation_steps: int  # None: the recipe's (hparams key of that name).
    global_batch_size: int  # None: ranks x train_batch_size x gradient_accumulation_steps.
    eval_batch_size: int
    eval_samples: int
    training_file_pattern: str
    validation_file_pattern: str
    val_json_file: str
    testdev_dir: str
    num_examples_per_epoch: int
    num_epochs: float
    iterations_per_loop: int
    log_every_n_steps: int
    cp_every_n_steps: int
    keep_checkpoint_max: int
    save_graph_def: bool
    min_eval_interval: int
    eval_timeout: int
    eval_after_training: bool
    early_stop_patience: int  # 0: never; train_and_eval evaluations without a better AP.
    use_fake_data: bool
    use_amp: bool
    use_xla: bool
    deterministic: bool
    seed: int
    use_horovod: object  # None (auto), a bool, or Habana's rank count (--use_horovod 8).
    no_hpu: bool
    device: str
    benchmark: bool
    benchmark_steps: int
    benchmark_warmup_steps: int
    profile_steps: str
    skip_bad_records: bool
    steps_file: str  # None: none; training/steps_file.py.
    dump_all_ranks: bool
    verbose: bool

    @classmethod
    def names(cls):
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def from_values(cls, values):
        """From a mapping with (at least) every field's name, e.g. {name: FLAGS[name].value}."""
        return cls(**{name: values[name] for name in cls.names()})

    def as_dict(self):
        return dataclasses.asdict(self)
