"""Pure compute over tensors and slot-index tensors; ops never see a request or the manager."""
