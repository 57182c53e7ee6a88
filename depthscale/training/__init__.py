"""Training a rung: loop, compiled steps, optimizer, training dynamics, sharding,
checkpoints, multi-host start-up, dry run, periodic analyses and output writers."""
