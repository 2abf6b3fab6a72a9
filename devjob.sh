#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
rm -rf /tmp/nowide && mkdir /tmp/nowide && cp -r pykernel stdlib_kernels llm benchmarks pyproject.toml /tmp/nowide/ && sed -i 's/"Q5_K", "Q8_0")$/"Q5_K")/' /tmp/nowide/stdlib_kernels/quant/gemm_q8_k.py && grep -n "^WIDE_TYPES" /tmp/nowide/stdlib_kernels/quant/gemm_q8_k.py
python3 -m pykernel synth --shape llama-8b --type Q8_0 -o /tmp/q80.gguf > /dev/null 2>&1 &
echo "== small_gemm Q8_0 at the runner's shapes"
python3 benchmarks/small_gemm.py --shapes 8b-q8_0 --tokens 128,512 --tiles 2.4.4.2.3,2.8.4.2.3 2>&1 | grep -E "split 1|auto|^\|---|shape"
date -u
wait
echo "== pp: new / before / nowide, new again"
python3 -m pykernel bench /tmp/q80.gguf -p 128,256,512 -n 0 -r 5 2>&1 | grep "^| synth"
(cd .before && PYTHONPATH=/tmp/site:$PWD python3 -m pykernel bench /tmp/q80.gguf -p 128,256,512 -n 0 -r 5 2>&1 | grep "^| synth")
(cd /tmp/nowide && PYTHONPATH=/tmp/site:$PWD python3 -m pykernel bench /tmp/q80.gguf -p 128,256 -n 0 -r 5 2>&1 | grep "^| synth")
python3 -m pykernel bench /tmp/q80.gguf -p 512 -n 0 -r 5 2>&1 | grep "^| synth"
date -u
