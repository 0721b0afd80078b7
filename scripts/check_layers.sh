#!/usr/bin/env bash
# The layering check: fails when an #include crosses a forbidden edge between tapelm's modules,
# or when BLAS, OpenMP, HDF5 or MPI show up outside the one place that owns them.
#
#   autograd   -> nothing above it
#   nn         -> autograd, but not its kernels or the tape's recording API (nn only combines ops)
#   optim      -> autograd
#   data       -> autograd (never nn, optim or train)
#   train      -> nn, optim, data, autograd's public headers (never kernels; BLAS only in convert/linalg.cpp)
#   train/convert -> as train, but of train/ only the formats, train_config, trainer.h (its public
#                 API), eval, run_dir, stop and itself: never the CLI or the sweep
#   train/formats -> as train, but of train/ only itself: the lowest floor of train/ (model formats,
#                 their containers and tapelm's own checkpoint)
#   train/cli  -> anything but kernels; nothing includes the CLI
#   tests, bench -> anything but the CLI
# OpenMP pragmas, cblas.h and oneDNN's headers live in autograd/kernels/ only; hdf5.h in the checkpoint module's
# HDF5 layer (and the tests of that layer); mpi.h in train/dist.cpp. The one exception is the conversion's
# double-precision linear algebra, train/convert/linalg.cpp: it may include cblas.h and LAPACKE's headers
# (its dgemm, Cholesky and SVD are no tensor ops), and no other file outside the kernels and bench/ may.
#
# Usage: scripts/check_layers.sh [ROOT]   (default: the repository). --self-test checks the checker.
set -euo pipefail

# Headers of autograd that only the op layer and the kernels may include.
KERNELS='^autograd/kernels/'
RECORD='^autograd/record\.h$'
HDF5_OWNERS='^(train/formats/h5file\.cpp|tests/test_h5\.cpp)$'
MPI_OWNERS='^train/dist\.cpp$'
LINALG='^train/convert/linalg\.cpp$'
# What the conversion and formats rooms may include from the rest of train/
CONVERT_MAY='^train/(formats/[^/]+|train_config\.h|trainer\.h|eval\.h|run_dir\.h|stop\.h|convert/[^/]+)$'
FORMATS_MAY='^train/formats/[^/]+$'

check() {
  local root=$1 bad=0
  local file rel line num target
  while IFS= read -r file; do
    rel=${file#"$root"/}
    local module
    case $rel in
      autograd/*) module=autograd ;;
      nn/*) module=nn ;;
      optim/*) module=optim ;;
      data/*) module=data ;;
      train/cli/*) module=cli ;;
      train/convert/*) module=convert ;;
      train/formats/*) module=formats ;;
      train/*) module=train ;;
      tests/*|bench/*) module=outside ;;
      *) continue ;;
    esac
    while IFS=: read -r num line; do
      local why=""
      if [[ $line =~ ^[[:space:]]*#[[:space:]]*pragma[[:space:]]+omp ]]; then
        [[ $rel =~ ^autograd/kernels/ ]] || why="OpenMP pragma outside autograd/kernels/"
      elif [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<([^>]+)\> ]]; then
        target=${BASH_REMATCH[1]}
        case $target in
          cblas.h) [[ $rel =~ ^autograd/kernels/ || $rel =~ ^bench/ || $rel =~ $LINALG ]] ||
                     why="<$target> outside autograd/kernels/ and train/convert/linalg.cpp" ;;
          lapacke.h|lapacke_*.h|lapack.h)
            [[ $rel =~ ^autograd/kernels/ || $rel =~ ^bench/ || $rel =~ $LINALG ]] ||
              why="<$target> outside autograd/kernels/ and train/convert/linalg.cpp" ;;
          openblas/*|omp.h|oneapi/*) [[ $rel =~ ^autograd/kernels/ || $rel =~ ^bench/ ]] || why="<$target> outside autograd/kernels/" ;;
          hdf5.h|H5*.h) [[ $rel =~ $HDF5_OWNERS ]] || why="<$target> outside the HDF5 layer" ;;
          mpi.h) [[ $rel =~ $MPI_OWNERS ]] || why="<$target> outside train/dist.cpp" ;;
        esac
      elif [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
        target=${BASH_REMATCH[1]}
        local to=${target%%/*}
        [[ $target == train/cli/* ]] && to=cli
        [[ $target == */* ]] || to=local
        case $module:$to in
          *:local) ;;
          cli:cli) ;;
          *:cli) why="nothing includes the CLI" ;;
          autograd:autograd) ;;
          autograd:*) why="autograd includes nothing above it" ;;
          nn:autograd)
            if [[ $target =~ $KERNELS || $target =~ $RECORD ]]; then why="nn only combines ops (no kernels, no recording)"; fi ;;
          nn:nn) ;;
          nn:*) why="nn depends on autograd only" ;;
          optim:autograd|optim:optim|data:autograd|data:data) ;;
          optim:*|data:*) why="$module depends on autograd only" ;;
          train:autograd|cli:autograd|convert:autograd|formats:autograd)
            if [[ $target =~ $KERNELS ]]; then why="train uses ops, not kernels or BLAS"; fi ;;
          convert:train)
            [[ $target =~ $CONVERT_MAY ]] || why="conversion includes no CLI, sweep or trainer internals" ;;
          formats:train)
            [[ $target =~ $FORMATS_MAY ]] || why="the formats are train/'s lowest floor: they include nothing else of train/" ;;
          convert:*|formats:*) ;;
          train:*|cli:*) ;;
          outside:*) ;;
        esac
      fi
      if [[ -n $why ]]; then
        echo "layering: $rel:$num: ${line#"${line%%[![:space:]]*}"}  ($why)"
        bad=1
      fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*(include|pragma[[:space:]]+omp)' "$file" || true)
  done < <(find "$root/autograd" "$root/nn" "$root/optim" "$root/data" "$root/train" "$root/tests" "$root/bench" \
                -type f \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null | sort)
  return $bad
}

self_test() {
  local t
  t=$(mktemp -d)
  trap 'rm -rf "$t"' RETURN
  mkdir -p "$t/autograd/kernels" "$t/nn" "$t/data" "$t/train/cli" "$t/train/convert" "$t/tests"
  printf '#include "autograd/tensor.h"\n' > "$t/nn/ok.h"
  printf '#pragma omp parallel for\n#include <cblas.h>\n' > "$t/autograd/kernels/k.cpp"
  mkdir -p "$t/train/convert" "$t/train/formats"
  printf '#include <cblas.h>\n#include <lapacke.h>\n' > "$t/train/convert/linalg.cpp"
  printf '#include "train/formats/checkpoint.h"\n#include "train/trainer.h"\n#include "train/convert/methods.h"\n' > "$t/train/convert/ok.cpp"
  mkdir -p "$t/train/formats"
  printf '#include "train/formats/checkpoint.h"\n#include "nn/gpt.h"\n#include "data/io.h"\n' > "$t/train/formats/ok.cpp"
  check "$t" > /dev/null || { echo "check_layers self-test: a clean tree was refused"; return 1; }
  local edge refused=0
  for edge in 'autograd/a.h:#include "nn/gpt.h"' 'nn/b.h:#include "autograd/kernels/blas.h"' \
              'nn/c.h:#include "autograd/record.h"' 'data/d.h:#include "nn/rng.h"' \
              'data/e.h:#include "train/trainer.h"' 'train/f.cpp:#include "autograd/kernels/kernels.h"' \
              'tests/g.cpp:#include "train/cli/cli.h"' 'train/h.cpp:#pragma omp parallel for' \
              'nn/i.cpp:#include <mpi.h>' 'train/j.cpp:#include <hdf5.h>' 'optim/k.cpp:#include "train/stop.h"' \
              'train/convert/l.cpp:#include "train/sweep/plan.h"' 'train/formats/m.cpp:#include "train/train_config.h"' \
              'train/formats/n.cpp:#include "train/trainer.h"' 'train/formats/o.cpp:#include "train/convert/convert.h"' \
              'train/convert/p.cpp:#include "train/cli/cli.h"' \
              'train/convert/q.cpp:#include <lapacke.h>' 'train/r.cpp:#include <cblas.h>' \
              'train/convert/linalg.h:#include <lapacke.h>' 'nn/n.cpp:#include <lapack.h>'; do
    local f=${edge%%:*} line=${edge#*:}
    mkdir -p "$t/$(dirname "$f")"
    printf '%s\n' "$line" > "$t/$f"
    if check "$t" > /dev/null; then echo "check_layers self-test: missed $f: $line"; return 1; fi
    rm "$t/$f"
    refused=$((refused + 1))
  done
  echo "check_layers self-test: ok (a clean tree passes, $refused forbidden edges are refused)"
}

if [[ ${1:-} == --self-test ]]; then
  self_test
  exit
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if check "$root"; then
  echo "layering: no forbidden include"
else
  exit 1
fi
