#!/usr/bin/env bash
# Installs the Debian packages tapelm needs to build, test and plot (only those missing).
set -euo pipefail
PKGS=(build-essential cmake pkg-config
      libopenblas-openmp-dev   # BLAS: the OpenMP build shares one thread pool with our kernels
      liblapacke-dev           # LAPACKE's C interface (lapacke.h) for the conversion's SPD solve and SVD; its
                               # LAPACK calls resolve to OpenBLAS's own copy, linked first
      libdnnl-dev              # oneDNN: a faster sgemm on most of tapelm's shapes (PyTorch's CPU backend)
      libhdf5-dev              # checkpoints and parity fixtures
      libboost-test-dev        # unit tests
      libcli11-dev             # command-line flags
      nlohmann-json3-dev       # configs, metrics, --json output
      libopenmpi-dev openmpi-bin  # data-parallel training: mpirun -np N tapelm train
      libsentencepiece-dev     # subword tokenizers: prepare trains and encodes BPE/unigram models
      sentencepiece            # spm_train/spm_encode: the tests' fixture script and prepare's benchmark
      libpcre2-dev             # byte-level BPE: the pre-tokenizer's Unicode regexes (\p{L}, lookahead), JIT-compiled
      libutf8proc-dev          # byte-level BPE: NFC normalization (Qwen2's tokenizer.json)
      libbenchmark-dev         # GEMM micro-benchmark
      qemu-user                # the tests run tapelm on an emulated CPU without AVX-512 (the instruction-set check)
      gnuplot-nox)             # loss curves and trade-off plots
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${missing[@]}"
fi
