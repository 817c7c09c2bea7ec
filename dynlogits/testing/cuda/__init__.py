"""CUDA semantics where no GPU is: the CUDA model (``simcuda``), adapters driven as engines drive
them on it (``drive``), and the same checks on a real GPU (``check``)."""
