"""What is kept on disk: the result cache, the tensor store, locks, atomic folders, paths."""
