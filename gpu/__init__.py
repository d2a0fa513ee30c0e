"""hyckpt GPU layer: the reference API on device tensors (Triton kernels, CUDA streams).

Modules, bottom up: :mod:`gpu.device` (streams and events; the only ``torch.cuda`` user),
:mod:`gpu.descriptors` (pointer/offset tables), :mod:`gpu.kernels` (the ``@triton.jit``
kernel), :mod:`gpu.launch` (launchers), :mod:`gpu.storage` (``GpuStorage``),
:mod:`gpu.export` (``GpuExporter``) and :mod:`gpu.impl` (``--impl gpu.impl:implementation``).
CUDA tensors run compiled kernels; CPU tensors run them in Triton's interpreter. See
docs/GPU.md. Importing this package itself imports nothing; its modules need Triton.
"""
