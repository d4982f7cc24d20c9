"""Devices and ranks: device choice, Horovod/MPI ranks and collectives, Habana's environment
defaults, rank-tagged logging. The only code that imports horovod or habana_frameworks."""
