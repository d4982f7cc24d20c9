"""One config system: defaults and the D0-D7x table (hparams_config), recipes (recipe), run
options (options), google/automl's config.yaml and key names (automl_config), Habana's and
the TPU-era flags (legacy_flags), and a run's configuration finalised once (settings: the
frozen config and every derived value, what model_fn and input_fn receive)."""
