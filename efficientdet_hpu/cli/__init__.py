"""The entry points: main (train/eval), demo_efficientdet (the launcher), inference (export,
predict), bench, model_inspect, plot_curves. Only these define absl flags, when they run."""
