"""Process basics under everything else: the one error policy (cli), atomic file writes,
TensorFlow's process settings (tf_env) and the root-name shims (compat). No ML, no flags."""
