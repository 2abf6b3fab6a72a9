#!/bin/bash
# pykernel vs llama.cpp on the same GPU and the same GGUF files (issue 8), on the device machine.
# Needs .llamacpp/ (made here by ../shared/bench/prepare_llamacpp.sh) and the wheels in .whl/.
#   bash benchmarks/side_by_side.sh start    # llama.cpp build in the background + synth files
#   bash benchmarks/side_by_side.sh finish   # wait for the build; llama-bench, then pykernel bench
#   (OURS=0 ... finish: llama.cpp only)
# Both phases must run on the same warm machine (the build lives in /tmp/llamacpp).
# Flags are ANCHORS.md's: -ngl 99 -fa 1 -p 512 -n 128 -r 3; ours: pykernel bench -p 512 -n 128 -r 3.
# DEPTH=4096 ... finish: both also at that many tokens of context (llama-bench -d 0,DEPTH; ours
# -d DEPTH as a second run). MODELS="shape:TYPE ..." picks the files.
set -uo pipefail
MODELS=${MODELS:-"smollm2-135m:Q4_1 qwen2-1.5b:Q4_K_M llama-8b:Q4_0 llama-8b:Q4_K_M"}
SYNTH=/tmp/synth; mkdir -p $SYNTH
case ${1:-} in
  start)
    (setsid bash .llamacpp/on_device.sh build-and-bench > /tmp/llamacpp-build.out 2>&1 &)
    for m in $MODELS; do
      shape=${m%%:*}; type=${m##*:}
      [ -f $SYNTH/$shape-$type.gguf ] || python3 -m pykernel synth --shape $shape --type $type \
        -o $SYNTH/$shape-$type.gguf
    done ;;
  finish)
    while [ ! -f /tmp/llamacpp/build.rc ]; do sleep 5; done
    [ "$(cat /tmp/llamacpp/build.rc)" = 0 ] || { tail -30 /tmp/llamacpp/build.log; exit 1; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
    for m in $MODELS; do
      f=$SYNTH/${m%%:*}-${m##*:}.gguf
      echo "== llama.cpp: $f"
      if [ -n "${DEPTH:-}" ]; then
        /tmp/llamacpp/llama.cpp/build/bin/llama-bench -m $f -ngl 99 -fa 1 -p 512 -n 128 -r 3 \
          -d 0,$DEPTH -o md 2>&1 | grep '^|'
      else
        bash .llamacpp/on_device.sh build-and-bench $f 2>&1 | grep '^|'
      fi
      [ "${OURS:-1}" = 0 ] && continue
      echo "== pykernel: $f"; python3 -m pykernel bench $f -p 512 -n 128 -r 3 2>&1 | grep '^|'
      [ -n "${DEPTH:-}" ] && python3 -m pykernel bench $f -p 512 -n 128 -r 3 -d $DEPTH 2>&1 \
        | grep '^|' | tail -2
    done ;;
  *) echo "usage: $0 start|finish"; exit 2 ;;
esac
