"""Process runtime: the distributed layer (Horovod/MPI ranks, collectives, device choice),
TensorFlow's process environment, and the atomic file writer. Importing the package loads
nothing: `from runtime import tf_env` must be able to run before TensorFlow is imported."""
