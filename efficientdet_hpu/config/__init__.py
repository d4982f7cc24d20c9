"""One config system: defaults and the D0-D7x table (hparams_config), recipes (recipe), run
options (options), google/automl's config.yaml and key names (automl_config), Habana's and
the TPU-era flags (legacy_flags), and the typed parameters the model_fn receives (params)."""
