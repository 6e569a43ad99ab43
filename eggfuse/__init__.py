"""eggfuse: egglog fusion rules, cost-based extraction and WGSL kernels on wgpu."""
