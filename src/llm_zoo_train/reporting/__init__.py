"""What a run shows: metrics tracking, progress lines and model cards."""
