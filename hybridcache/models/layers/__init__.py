"""Layer kinds shared by model families; each file one kind, parameters named as in HF checkpoints."""
