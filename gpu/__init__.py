"""hyckpt GPU layer: the reference API on device tensors (Triton kernels, CUDA streams).

Implemented by a later issue; importing this package needs no Triton yet.
"""
