"""Mixture-of-experts kernels: the router (router.py), the expert GEMVs for decode and the
grouped-by-expert path for prompts (experts.py, grouping.py; its int8 tensor-core GEMM
grouped_gemm.py), with numpy references
(reference.py). docs/stdlib.md, "MoE kernels", has the signatures."""
