#!/bin/bash
# Packs the CUDA build for the GPU machine, whose image lacks some -dev
# libraries: bin/ (gemma4, the CUDA tests and bench/cuda_ops_bench), lib/ (every shared library they
# load outside glibc; bench/cuda_h200.sh copies only those the machine lacks)
# and COMMIT. Usage: bench/make_prebuilt.sh BUILD_DIR OUT.tar.xz
set -eu
build=$1 out=$2
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib"
# EXTRA_TESTS="test_engine ...": more test programs of $build/tests beside the CUDA ones
cp "$build/gemma4" "$build/cuda_ops_bench" "$build"/tests/test_cuda_* "$build/tests/test_assistant" "$stage/bin/"
for t in ${EXTRA_TESTS:-}; do cp "$build/tests/$t" "$stage/bin/"; done
# EXTRA_BINS="constrain_step_bench ...": programs of $build itself (the benchmarks)
for t in ${EXTRA_BINS:-}; do cp "$build/$t" "$stage/bin/"; done
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*.so*|libnv*.so*) ;; # the GPU machine has CUDA 13
      *) cp -L -n "$lib" "$stage/lib/" ;;
    esac
  done
done
git rev-parse --short HEAD > "$stage/COMMIT"
XZ_OPT=${XZ_OPT:--9} tar -cJf "$out" -C "$stage" bin lib COMMIT
rm -rf "$stage"
ls -la "$out"
