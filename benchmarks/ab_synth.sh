#!/bin/bash
# The runner's speed, two trees side by side in one call: `pykernel bench -p 512 -n 128` of the
# synthetic files the issues quote (llama-8B Q4_K_M, qwen2-1.5B Q4_K_M, SmolLM2-135M Q4_1, made
# by `pykernel synth` with the new tree), the trees alternating round by round.
#   benchmarks/ab_synth.sh BASE_TREE NEW_TREE [ROUNDS]
# A tree is a folder holding pykernel/, llm/ and stdlib_kernels/ (e.g. `git archive COMMIT
# pykernel llm stdlib_kernels | tar -x -C DIR`). Files go to $AB_MODELS (default /tmp/ab_models).
set -euo pipefail
base=$(realpath "$1"); new=$(realpath "$2"); rounds=${3:-2}
models=${AB_MODELS:-/tmp/ab_models}
mkdir -p "$models"
for spec in "llama-8b Q4_K_M" "qwen2-1.5b Q4_K_M" "smollm2-135m Q4_1"; do
    set -- $spec
    file="$models/$1-$2.gguf"
    [ -f "$file" ] || PYTHONPATH="$new:${PYTHONPATH:-}" python3 -m pykernel synth --shape "$1" \
        --type "$2" -o "$file" >/dev/null
done
for round in $(seq "$rounds"); do
    for tree in "$base" "$new"; do
        for file in "$models"/*.gguf; do
            echo "== round $round, tree $tree, $(basename "$file")"
            PYTHONPATH="$tree:${PYTHONPATH:-}" python3 -m pykernel bench "$file" -p 512 -n 128 -r 3
        done
    done
done
