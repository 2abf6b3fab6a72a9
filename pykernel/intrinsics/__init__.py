"""Intrinsics: the `pk.*` operations kernels call (thread model, memory, warp ops, atomics,
math, tensor cores, inline PTX). Each lowers through the target, so the same call works on the
GPU and on the CPU target."""
