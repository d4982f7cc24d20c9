"""Serving a trained model: what it is built from (model_spec), the frozen detection graph
and its predictors (detector), the SavedModel export, prediction on image files and drawing."""
