"""What a trial writes and reads back: samples and batch files, per-token uncertainty, checkpoints restored, a run replayed."""
