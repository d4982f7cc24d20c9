"""Process basics under everything else: the one error policy (cli), atomic file writes,
TensorFlow's process settings (tf_env), the root-name shims (compat) and every command's --help
(command_help). No ML, and no command's flags."""
