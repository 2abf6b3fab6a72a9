"""Lowering: a parsed kernel + specialization -> llvmlite ir.Module for one target."""
