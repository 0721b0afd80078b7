#!/usr/bin/env bash
# Builds bench/llama_cpp_decode.cpp into OUT_DIR/lcd against the llama.h of the llama.cpp source
# node-llama-cpp bundles, linked to the prebuilt CPU libraries of @node-llama-cpp/linux-x64 (their
# directory, the backend directory lcd's first argument names, is printed). Used by
# bench/llama_cpp_decode.sh and bench/decode_7b.sh.
#
#   libs=$(bash bench/build_llama_cpp_decode.sh NODE_MODULES OUT_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
modules=$1
out=$2
libs="$modules/@node-llama-cpp/linux-x64/bins/linux-x64"
git clone -q --depth 1 "$modules/node-llama-cpp/llama/gitRelease.bundle" "$out/llama.cpp" 2> /dev/null
g++ -O2 -std=c++17 -I"$out/llama.cpp/include" -I"$out/llama.cpp/ggml/include" bench/llama_cpp_decode.cpp -o "$out/lcd" \
  "$libs"/libllama.v*.so "$libs"/libggml.v*.so "$libs/libggml-base.so" -Wl,-rpath,"$libs"
echo "$libs"
