"""Fault injection and fuzzing: kills, corrupt records, full/read-only disks, locks, bad input, bad methods."""
